#pragma once
// Token sampling: greedy, temperature, top-k, top-p, seeded.

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "runtime/model/vocab.h"

namespace choreo::model {

/// Sampling settings; temperature <= 0 means greedy (argmax, first index on ties).
struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;        // <= 0: no limit
  float top_p = 0.95f;   // >= 1: no limit
  uint64_t seed = 0;
};

/// Draws tokens from logits with its own seeded generator (one per decoding message).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  Token sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, Token>> candidates_;  // reused across calls: sampling allocates nothing
  std::vector<double> probs_;
};

/// The index of the largest logit (the first on ties).
Token argmax(std::span<const float> logits);

}  // namespace choreo::model
