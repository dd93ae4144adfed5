#include "common/statistics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <random>
#include <vector>

namespace choreo::stats {

namespace {

/// A uniform index in [0, n) from one 64-bit draw (Lemire's multiply-shift; the bias is below 2^-50 for
/// any sample size here). std::uniform_int_distribution is not the same on every standard library.
size_t draw_index(std::mt19937_64& rng, size_t n) {
  return static_cast<size_t>((static_cast<unsigned __int128>(rng()) * n) >> 64);
}

double mean_of(std::span<const double> values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

}  // namespace

double percentile_sorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double position = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

Interval bootstrap_interval(size_t n, const std::function<double(std::span<const size_t>)>& statistic,
                            int resamples, uint64_t seed) {
  Interval out;
  if (n == 0) return out;
  std::mt19937_64 rng(seed);
  std::vector<size_t> rows(n);
  std::vector<double> values(static_cast<size_t>(std::max(resamples, 1)));
  for (double& v : values) {
    for (size_t& row : rows) row = draw_index(rng, n);
    v = statistic(rows);
  }
  std::sort(values.begin(), values.end());
  out.low = percentile_sorted(values, 2.5);
  out.high = percentile_sorted(values, 97.5);
  return out;
}

Estimate bootstrap_mean(std::span<const double> values, int resamples, uint64_t seed) {
  Estimate out;
  out.n = values.size();
  if (values.empty()) return out;
  out.mean = mean_of(values);
  const Interval interval = bootstrap_interval(
      values.size(),
      [&](std::span<const size_t> rows) {
        double sum = 0;
        for (size_t row : rows) sum += values[row];
        return sum / static_cast<double>(values.size());
      },
      resamples, seed);
  // Rounding in the resampled sums can put a percentile an ulp beyond the mean of a constant sample.
  out.low = std::min(interval.low, out.mean);
  out.high = std::max(interval.high, out.mean);
  return out;
}

Estimate paired_difference(std::span<const double> baseline, std::span<const double> treatment, int resamples,
                           uint64_t seed) {
  assert(baseline.size() == treatment.size());
  std::vector<double> differences(baseline.size());
  for (size_t i = 0; i < baseline.size(); ++i) differences[i] = treatment[i] - baseline[i];
  return bootstrap_mean(differences, resamples, seed);
}

RatioEstimate bootstrap_ratio(std::span<const double> numerator, std::span<const double> denominator,
                              int resamples, uint64_t seed) {
  RatioEstimate out;
  const size_t n = std::min(numerator.size(), denominator.size());
  if (n == 0) return out;
  auto ratio_of = [&](auto&& rows) {
    double a = 0, b = 0;
    for (size_t row : rows) {
      a += numerator[row];
      b += denominator[row];
    }
    return b > 0 ? a / b : 0.0;
  };
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  out.ratio = ratio_of(all);
  const Interval interval =
      bootstrap_interval(n, [&](std::span<const size_t> rows) { return ratio_of(rows); }, resamples, seed);
  out.low = interval.low;
  out.high = interval.high;
  return out;
}

double mcnemar_exact_p(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n == 0) return 1.0;
  const int64_t k_max = std::min(b, c);
  // Sum the binomial(n, 1/2) tail in log space: 2^-n underflows past n = 1074.
  const double log_half_n = static_cast<double>(n) * std::log(0.5);
  const double log_n_factorial = std::lgamma(static_cast<double>(n) + 1);
  double tail = 0;
  for (int64_t k = 0; k <= k_max; ++k) {
    const double log_choose = log_n_factorial - std::lgamma(static_cast<double>(k) + 1) -
                              std::lgamma(static_cast<double>(n - k) + 1);
    tail += std::exp(log_choose + log_half_n);
  }
  return std::min(1.0, 2.0 * tail);
}

McNemar mcnemar(std::span<const double> baseline, std::span<const double> treatment) {
  assert(baseline.size() == treatment.size());
  McNemar out;
  for (size_t i = 0; i < baseline.size(); ++i) {
    const bool was_right = baseline[i] >= 0.5, is_right = treatment[i] >= 0.5;
    if (was_right && !is_right) ++out.b;
    if (!was_right && is_right) ++out.c;
  }
  out.p_value = mcnemar_exact_p(out.b, out.c);
  return out;
}

}  // namespace choreo::stats
