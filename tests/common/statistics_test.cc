// Statistics for evaluation summaries (common/statistics.h): exact McNemar p-values worked by hand,
// percentiles by numpy's rule, and bootstrap intervals checked against their defining properties.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "common/statistics.h"

namespace choreo::stats {
namespace {

TEST_CASE("eval statistics: McNemar's exact test, by hand") {
  // n = 10, P[X <= 1] = (1 + 10) / 1024; two-sided doubles it.
  CHECK(mcnemar_exact_p(1, 9) == doctest::Approx(0.021484375).epsilon(1e-12));
  CHECK(mcnemar_exact_p(9, 1) == doctest::Approx(0.021484375).epsilon(1e-12));
  CHECK(mcnemar_exact_p(0, 5) == doctest::Approx(2.0 / 32).epsilon(1e-12));
  CHECK(mcnemar_exact_p(2, 10) == doctest::Approx(2.0 * 79 / 4096).epsilon(1e-12));  // 1 + 12 + 66 = 79
  CHECK(mcnemar_exact_p(5, 5) == 1.0);  // 2 * 638/1024 > 1 is capped
  CHECK(mcnemar_exact_p(0, 0) == 1.0);
  // Past n = 1074, 2^-n underflows; the log-space sum stays finite, positive and symmetric.
  const double p = mcnemar_exact_p(1000, 1300);
  CHECK(p > 0.0);
  CHECK(p < 1e-9);
  CHECK(p == doctest::Approx(mcnemar_exact_p(1300, 1000)));
  CHECK(mcnemar_exact_p(600, 600) == 1.0);
}

TEST_CASE("eval statistics: McNemar counts discordant 0/1 pairs") {
  const std::vector<double> baseline = {1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  const std::vector<double> treatment = {1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const McNemar m = mcnemar(baseline, treatment);
  CHECK(m.b == 1);
  CHECK(m.c == 8);
  CHECK(m.p_value == doctest::Approx(2.0 * (1 + 9) / 512).epsilon(1e-12));
}

TEST_CASE("eval statistics: percentiles interpolate linearly between order statistics") {
  const std::vector<double> four = {1, 2, 3, 4};
  CHECK(percentile_sorted(four, 50) == 2.5);
  CHECK(percentile_sorted(four, 0) == 1);
  CHECK(percentile_sorted(four, 100) == 4);
  std::vector<double> hundred_and_one(101);
  for (int i = 0; i <= 100; ++i) hundred_and_one[i] = i;
  CHECK(percentile_sorted(hundred_and_one, 2.5) == doctest::Approx(2.5));
  CHECK(percentile_sorted(hundred_and_one, 97.5) == doctest::Approx(97.5));
}

TEST_CASE("eval statistics: bootstrap intervals are deterministic and bracket the mean") {
  std::vector<double> scores;
  for (int i = 0; i < 400; ++i) scores.push_back(i % 2);
  const Estimate a = bootstrap_mean(scores), b = bootstrap_mean(scores);
  CHECK(a.mean == 0.5);
  CHECK(a.low == b.low);
  CHECK(a.high == b.high);
  CHECK(a.low < a.mean);
  CHECK(a.mean < a.high);
  // For 0/1 data the interval's half-width approaches 1.96 * sqrt(p (1 - p) / n) = 0.049.
  CHECK((a.high - a.low) / 2 == doctest::Approx(0.049).epsilon(0.15));
  const Estimate other_seed = bootstrap_mean(scores, kBootstrapResamples, kBootstrapSeed + 1);
  CHECK(other_seed.mean == a.mean);
  CHECK((other_seed.low != a.low || other_seed.high != a.high));

  const std::vector<double> constant(50, 0.3);
  const Estimate c = bootstrap_mean(constant);
  CHECK(c.low == c.mean);
  CHECK(c.high == c.mean);
  const Estimate one = bootstrap_mean(std::vector<double>{0.7});
  CHECK(one.low == 0.7);
  CHECK(one.high == 0.7);
  CHECK(bootstrap_mean(std::vector<double>{}).n == 0);
}

TEST_CASE("eval statistics: paired differences resample pairs") {
  const std::vector<double> base = {0.1, 0.5, 0.9, 0.2};
  std::vector<double> shifted;
  for (double v : base) shifted.push_back(v + 0.25);
  const Estimate d = paired_difference(base, shifted);
  CHECK(d.mean == doctest::Approx(0.25));
  CHECK(d.low == doctest::Approx(0.25));  // every pair differs by the same amount
  CHECK(d.high == doctest::Approx(0.25));
  const Estimate none = paired_difference(base, base);
  CHECK(none.mean == 0.0);
  CHECK(none.low == 0.0);
  CHECK(none.high == 0.0);
}

TEST_CASE("bootstrap_ratio: the ratio of sums, inside its interval, exact when every pair has the same ratio") {
  const RatioEstimate r = bootstrap_ratio(std::vector<double>{10, 20, 30, 40}, std::vector<double>{1, 4, 3, 2});
  CHECK(r.ratio == doctest::Approx(100.0 / 10.0));
  CHECK(r.low <= r.ratio);
  CHECK(r.high >= r.ratio);
  CHECK(r.low < r.high);
  const RatioEstimate same = bootstrap_ratio(std::vector<double>{3, 6, 9}, std::vector<double>{1, 2, 3});
  CHECK(same.ratio == doctest::Approx(3.0));
  CHECK(same.low == doctest::Approx(3.0));
  CHECK(same.high == doctest::Approx(3.0));
}

TEST_CASE("one bootstrap: a ratio over unit denominators has the interval of the mean, draw for draw") {
  // bootstrap_mean and bootstrap_ratio share bootstrap_interval's index draws: with every denominator 1,
  // the resampled ratio of sums is the resampled sum / n, i.e. the resampled mean. (Before issue 10 the
  // ratio drew rng() % n, the mean Lemire's multiply-shift, and the two intervals differed.)
  std::vector<double> values;
  for (int i = 0; i < 37; ++i) values.push_back((i * 7919) % 101 / 10.0);
  const std::vector<double> ones(values.size(), 1.0);
  const Estimate mean = bootstrap_mean(values);
  const RatioEstimate ratio = bootstrap_ratio(values, ones);
  CHECK(ratio.ratio == doctest::Approx(mean.mean));
  CHECK(ratio.low == doctest::Approx(mean.low).epsilon(1e-12));
  CHECK(ratio.high == doctest::Approx(mean.high).epsilon(1e-12));
  CHECK(ratio.low < ratio.high);
  // Different seeds draw different rows.
  const RatioEstimate other = bootstrap_ratio(values, ones, kBootstrapResamples, kBootstrapSeed + 1);
  CHECK((other.low != ratio.low || other.high != ratio.high));
}

}  // namespace
}  // namespace choreo::stats
