#include "runtime/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace choreo::model {

Token argmax(std::span<const float> logits) {
  return Token(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

namespace {

/// Sampling's order of candidates: logit descending, ties by the lower token first (kernels::Backend::top_k's).
bool by_logit(const std::pair<float, Token>& a, const std::pair<float, Token>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

Token Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return argmax(logits);
  const int n = int(logits.size());
  candidates_.resize(n);
  for (int i = 0; i < n; ++i) candidates_[i] = {logits[i], Token(i)};
  const int keep = kept(n);
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);
  return draw();
}

Token Sampler::sample_candidates(std::span<const float> values, std::span<const int32_t> ids) {
  if (values.empty() || values.size() != ids.size())
    throw std::invalid_argument("sample_candidates: " + std::to_string(values.size()) + " values and " +
                                std::to_string(ids.size()) + " ids");
  const int keep = kept(int(values.size()));
  candidates_.resize(keep);
  for (int i = 0; i < keep; ++i) {
    candidates_[i] = {values[i], Token(ids[i])};
    if (i > 0 && !by_logit(candidates_[i - 1], candidates_[i]))
      throw std::invalid_argument("sample_candidates: candidate " + std::to_string(i) +
                                  " is out of order (value descending, ties by the lower id)");
  }
  if (params_.temperature <= 0.0f) return candidates_[0].second;  // argmax: the first index on ties
  return draw();
}

Token Sampler::draw() {
  const int keep = int(candidates_.size());
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
