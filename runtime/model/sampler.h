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
  /// The same draw from precomputed candidates: a row's largest logits and their token ids, in the order
  /// kernels::Backend::top_k returns them (value descending, ties by the lower id first), at least
  /// min(params().top_k, vocabulary) of them (the whole vocabulary when top_k <= 0); any beyond top_k are
  /// ignored. For the same params and seed it returns what sample(logits) returns when the candidates are
  /// top_k(logits, that many). Empty, unequal or unsorted spans throw std::invalid_argument.
  Token sample_candidates(std::span<const float> values, std::span<const int32_t> ids);
  const SamplingParams& params() const { return params_; }

 private:
  /// How many candidates of n are kept (top_k).
  int kept(int n) const { return (params_.top_k > 0 && params_.top_k < n) ? params_.top_k : n; }
  /// Draws from candidates_ (sorted, already cut to top_k): softmax at the temperature, top_p, the draw.
  Token draw();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, Token>> candidates_;  // reused across calls: sampling allocates nothing
  std::vector<double> probs_;
};

/// The index of the largest logit (the first on ties).
Token argmax(std::span<const float> logits);

}  // namespace choreo::model
