#include "runtime/model/sampler.h"

#include <algorithm>
#include <cmath>

namespace choreo::model {

Token argmax(std::span<const float> logits) {
  return Token(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

Token Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return argmax(logits);
  const int n = int(logits.size());
  candidates_.resize(n);
  for (int i = 0; i < n; ++i) candidates_[i] = {logits[i], Token(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int keep = (params_.top_k > 0 && params_.top_k < n) ? params_.top_k : n;
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);
  // Softmax at temperature, then the smallest prefix whose mass reaches top_p.
  const float max_logit = candidates_[0].first;
  std::vector<double>& probs = probs_;
  probs.resize(keep);
  double total = 0.0;
  for (int i = 0; i < keep; ++i) {
    probs[i] = std::exp(double(candidates_[i].first - max_logit) / params_.temperature);
    total += probs[i];
  }
  int cut = keep;
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (int i = 0; i < keep; ++i) {
      mass += probs[i] / total;
      if (mass >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  double cut_total = 0.0;
  for (int i = 0; i < cut; ++i) cut_total += probs[i];
  double r = std::uniform_real_distribution<double>(0.0, cut_total)(rng_);
  for (int i = 0; i < cut; ++i) {
    r -= probs[i];
    if (r < 0.0) return candidates_[i].second;
  }
  return candidates_[cut - 1].second;
}

}  // namespace choreo::model
