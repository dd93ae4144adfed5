#pragma once
// The statistics the Prompt Choreography paper reports: a mean with a 95% percentile-bootstrap interval,
// the paired difference of two modes with its bootstrap interval, a ratio of sums with its interval
// (`choreo profile`), and McNemar's exact test for 0/1 scores. Used by runtime/eval and runtime/exec.
// Everything is deterministic: one bootstrap (`bootstrap_interval`) draws from a fixed-seed mt19937_64
// (standardised output) with an index mapping of our own, so the same data give the same interval on every
// machine.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace choreo::stats {

inline constexpr int kBootstrapResamples = 2000;
inline constexpr uint64_t kBootstrapSeed = 20240611;

/// A mean and its 95% interval (low <= mean <= high for any non-empty sample).
struct Estimate {
  size_t n = 0;
  double mean = 0, low = 0, high = 0;
};

/// The 2.5th and 97.5th percentiles of `statistic` over `resamples` bootstrap resamples of n rows: each
/// resample draws n row indices in [0, n) with replacement. The one bootstrap every estimate below uses.
/// n = 0 gives {0, 0}.
struct Interval {
  double low = 0, high = 0;
};
Interval bootstrap_interval(size_t n, const std::function<double(std::span<const size_t>)>& statistic,
                            int resamples = kBootstrapResamples, uint64_t seed = kBootstrapSeed);

/// The mean of `values` with the 2.5th and 97.5th percentiles (linear interpolation between order
/// statistics, numpy's default) of `resamples` bootstrap means. n = 0 gives all zeros.
Estimate bootstrap_mean(std::span<const double> values, int resamples = kBootstrapResamples,
                        uint64_t seed = kBootstrapSeed);

/// Mean of treatment[i] - baseline[i] over pairs, with the bootstrap interval of resampled pairs.
/// The spans must have equal lengths (asserted).
Estimate paired_difference(std::span<const double> baseline, std::span<const double> treatment,
                           int resamples = kBootstrapResamples, uint64_t seed = kBootstrapSeed);

/// A ratio of sums with its 95% interval over paired rows.
struct RatioEstimate {
  double ratio = 0, low = 0, high = 0;
};

/// sum(numerator) / sum(denominator) (= the ratio of the means) over the pairs, with the bootstrap interval
/// of that ratio over resampled pairs (fixed seed: deterministic). Extra values in the longer vector are
/// ignored; a zero denominator sum gives 0.
RatioEstimate bootstrap_ratio(std::span<const double> numerator, std::span<const double> denominator,
                              int resamples = kBootstrapResamples, uint64_t seed = kBootstrapSeed);

/// McNemar's exact test: discordant pairs b (baseline right, treatment wrong) and c (the reverse).
struct McNemar {
  int64_t b = 0, c = 0;
  double p_value = 1;
};
/// Two-sided exact p-value: min(1, 2 * P[X <= min(b, c)]) for X ~ Binomial(b + c, 1/2); 1 when b + c = 0.
double mcnemar_exact_p(int64_t b, int64_t c);
/// Counts b and c over 0/1 scores (a score >= 0.5 counts as right) and tests them.
McNemar mcnemar(std::span<const double> baseline, std::span<const double> treatment);

/// The q-th percentile (0..100) of sorted values, numpy's linear method.
double percentile_sorted(std::span<const double> sorted, double q);

}  // namespace choreo::stats
