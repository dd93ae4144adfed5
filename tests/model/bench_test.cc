// `choreo bench`'s measurement (runtime/model/bench.h) on stories260K: one result per test asked for, named
// as llama-bench names it, with a positive rate per repetition whose mean and standard deviation are the ones
// reported; impossible requests are InputErrors.

#include "runtime/model/bench.h"

#include <doctest/doctest.h>

#include <cmath>

#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

TEST_CASE("bench: one result per test, a positive rate per repetition, mean and deviation of those rates") {
  const model::Model& m = *testing::stories260k().model;
  model::BenchOptions o;
  o.n_prompt = 24;
  o.n_gen = 6;
  o.repetitions = 3;
  o.n_depth = 8;
  o.parallel = {1, 3};
  o.parallel_prompt = 5;
  const std::vector<model::BenchResult> results = model::bench(m, nullptr, m.kv_layout(16), o);
  REQUIRE(results.size() == 4);
  CHECK(results[0].test == "pp24 @ d8");
  CHECK(results[1].test == "tg6 @ d8");
  CHECK(results[2].test == "tg6 x1");
  CHECK(results[3].test == "tg6 x3");
  for (const model::BenchResult& r : results) {
    CAPTURE(r.test);
    REQUIRE(r.samples_tokens_per_s.size() == 3);
    double sum = 0;
    for (double s : r.samples_tokens_per_s) {
      CHECK(s > 0);
      CHECK(std::isfinite(s));
      sum += s;
    }
    const double mean = sum / 3;
    CHECK(r.mean_tokens_per_s == doctest::Approx(mean));
    double squares = 0;
    for (double s : r.samples_tokens_per_s) squares += (s - mean) * (s - mean);
    CHECK(r.stddev_tokens_per_s == doctest::Approx(std::sqrt(squares / 2)));
  }
}

TEST_CASE("bench: a skipped test has no result, one repetition has no deviation") {
  const model::Model& m = *testing::stories260k().model;
  model::BenchOptions o;
  o.n_prompt = 0;
  o.n_gen = 4;
  o.repetitions = 1;
  const std::vector<model::BenchResult> results = model::bench(m, nullptr, m.kv_layout(16), o);
  REQUIRE(results.size() == 1);
  CHECK(results[0].test == "tg4");
  CHECK(results[0].samples_tokens_per_s.size() == 1);
  CHECK(results[0].stddev_tokens_per_s == 0.0);
}

TEST_CASE(
    "bench: nothing to measure, parallel tests without generation, and tests past the context are refused") {
  const model::Model& m = *testing::stories260k().model;
  model::BenchOptions nothing;
  nothing.n_prompt = nothing.n_gen = 0;
  CHECK(testing::input_error_text([&] { model::check_bench_options(nothing); }).find("nothing to measure") !=
        std::string::npos);
  model::BenchOptions parallel;
  parallel.n_gen = 0;
  parallel.parallel = {2};
  CHECK(testing::input_error_text([&] {
          model::bench(m, nullptr, m.kv_layout(16), parallel);
        }).find("--parallel") != std::string::npos);
  model::BenchOptions deep;
  deep.n_prompt = 16;
  deep.n_depth = m.config().n_ctx_train;
  CHECK(testing::input_error_text([&] { model::bench(m, nullptr, m.kv_layout(16), deep); }).find("context") !=
        std::string::npos);
}

}  // namespace
}  // namespace choreo
