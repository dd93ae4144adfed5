#include "runtime/eval/divergence.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace choreo::eval {

std::vector<double> log_softmax(std::span<const float> logits) {
  if (logits.empty()) return {};
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - top);
  const double log_sum = top + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - log_sum;
  return out;
}

double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  assert(p_logits.size() == q_logits.size());
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, kl);
}

double mean_kl(const std::vector<std::vector<float>>& p_logits,
               const std::vector<std::vector<float>>& q_logits) {
  const size_t n = std::min(p_logits.size(), q_logits.size());
  if (n == 0) return 0;
  double total = 0;
  for (size_t t = 0; t < n; ++t) total += kl_divergence(p_logits[t], q_logits[t]);
  return total / double(n);
}

int token_rank(std::span<const float> logits, Token token) {
  assert(token >= 0 && size_t(token) < logits.size());
  const float own = logits[size_t(token)];
  return 1 + int(std::count_if(logits.begin(), logits.end(), [own](float x) { return x > own; }));
}

}  // namespace choreo::eval
