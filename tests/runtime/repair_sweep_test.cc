// `profile quality --sweep`'s arithmetic (runtime/eval/repair_sweep.h), checked against brute force: the
// Pareto frontier, the choice under a KL bound, the shares of the gap closed and of the speed-up kept, and the
// policy file read back.

#include <doctest/doctest.h>

#include <fstream>
#include <random>

#include "common/error.h"
#include "runtime/eval/repair_sweep.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

/// Whether row a dominates row b: no worse on both, better on one.
bool dominates(double xa, double ka, double xb, double kb) {
  return xa <= xb && ka <= kb && (xa < xb || ka < kb);
}

TEST_CASE("repair sweep: the Pareto rows are exactly the undominated ones, as a pairwise check finds them") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 9;
    std::vector<double> x, kl;
    for (size_t i = 0; i < n; ++i) {
      // Few distinct values, so that ties happen.
      x.push_back(double(rng() % 5));
      kl.push_back(double(rng() % 4) / 10);
    }
    const std::vector<size_t> frontier = eval::pareto_rows(x, kl);
    std::vector<bool> on(n, false);
    for (size_t i : frontier) on[i] = true;
    for (size_t i = 0; i < n; ++i) {
      bool dominated = false, earlier_twin = false;
      for (size_t j = 0; j < n; ++j) {
        dominated = dominated || dominates(x[j], kl[j], x[i], kl[i]);
        earlier_twin = earlier_twin || (j < i && x[j] == x[i] && kl[j] == kl[i]);
      }
      CAPTURE(trial);
      CAPTURE(i);
      CHECK(on[i] == (!dominated && !earlier_twin));
    }
    for (size_t k = 1; k < frontier.size(); ++k) CHECK(x[frontier[k - 1]] <= x[frontier[k]]);
  }
}

/// A profile of `n` policies with the given workflow KL, computed tokens and per-round TTFTs.
eval::QualityProfile profile_of(const std::vector<double>& kl, const std::vector<double>& computed,
                                const std::vector<std::vector<double>>& ttft_speedup) {
  eval::QualityProfile p;
  p.workflow = "wf";
  for (size_t i = 0; i < kl.size(); ++i) {
    eval::VariantQuality q;
    q.name = i == 0 ? "none" : "p" + std::to_string(i);
    q.workflow.kl.mean = kl[i];
    q.workflow.computed = computed[i];
    q.ttft_speedup = ttft_speedup[i];
    q.e2e_speedup = ttft_speedup[i];
    p.variants.push_back(q);
  }
  return p;
}

TEST_CASE("repair sweep: the choice is the fewest tokens computed under the bound, half of none's KL by default") {
  const eval::QualityProfile p =
      profile_of({0.04, 0.03, 0.015, 0.019, 0.002}, {500, 520, 700, 650, 1100},
                 {{10, 8}, {6, 6}, {3, 2}, {4, 5}, {1, 1}});
  const eval::RepairSweep by_default = eval::summarize_sweep(p, 2, std::nullopt);
  CHECK(by_default.max_kl == doctest::Approx(0.02));
  REQUIRE(by_default.chosen);
  CHECK(by_default.rows[*by_default.chosen].policy == "p3");  // 650 tokens, KL 0.019 <= 0.02
  // Shares, computed by hand: p2 closes 1 - 0.015/0.04 of the gap; p3 keeps 4.5/9 of none's speed-up.
  CHECK(by_default.rows[2].gap_closed == doctest::Approx(0.625));
  CHECK(by_default.rows[3].speedup_kept == doctest::Approx(0.5));
  CHECK(by_default.rows[0].ttft_speedup.min == 8);
  CHECK(by_default.rows[0].ttft_speedup.max == 10);
  // The frontier over (computed, KL): every row but none of them dominated here.
  for (const eval::SweepRow& row : by_default.rows) CHECK(row.frontier);
  const eval::RepairSweep strict = eval::summarize_sweep(p, 2, 0.01);
  REQUIRE(strict.chosen);
  CHECK(strict.rows[*strict.chosen].policy == "p4");
  CHECK(strict.max_kl_given);
  CHECK_FALSE(eval::summarize_sweep(p, 2, 0.001).chosen);
  CHECK(eval::sweep_table(strict).find("| p4 (chosen) |") != std::string::npos);
  CHECK(eval::sweep_svg(strict, eval::SweepAxis::Ttft).find("class=\"chosen\"") != std::string::npos);
}

TEST_CASE("repair sweep: the policy file is read back as the policy chosen, and a file without one is refused") {
  testing::ScratchDir dir;
  const eval::QualityProfile p = profile_of({0.04, 0.01}, {500, 600}, {{9}, {8}});
  eval::QualityProfile named = p;
  named.variants[1].name = "select:0.15";
  eval::write_sweep(eval::summarize_sweep(named, 1, std::nullopt), named, dir.path.string());
  const RepairPolicy read = eval::read_repair_policy_file((dir.path / "repair.json").string());
  CHECK(read.name() == "select:0.15");
  // No policy under the bound: no repair.json, not even the one written before.
  eval::write_sweep(eval::summarize_sweep(named, 1, 0.0001), named, dir.path.string());
  CHECK_FALSE(std::filesystem::exists(dir.path / "repair.json"));
  for (const char* text : {"[]", "{\"choreo_repair_policy\": 1}", "{\"choreo_repair_policy\": 1, \"policy\": \"x\"}",
                           "{\"policy\": \"none\"}", "not json"}) {
    std::ofstream(dir.path / "bad.json") << text;
    CAPTURE(text);
    CHECK_THROWS_AS(eval::read_repair_policy_file((dir.path / "bad.json").string()), InputError);
  }
}

}  // namespace
}  // namespace choreo
