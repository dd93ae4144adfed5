#pragma once
// `choreo profile quality --sweep` (docs/profile.md, "Choosing a repair policy"): the repair policies of
// common/repair_policy.h compared on the same instances and the same exact baseline (quality_profile.h), each
// policy's KL to that baseline against its cost (tokens computed, TTFT), the Pareto frontier of KL against
// tokens computed, and the cheapest policy under a KL bound, written as a file `choreo run --repair` reads.

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/repair_policy.h"
#include "runtime/eval/quality_profile.h"

namespace choreo::eval {

/// What --sweep compares: none, first:{1,4,16,64}, select:{0.05,0.15,0.3}.
std::vector<RepairPolicy> sweep_policies();

/// A range of per-round figures: their mean, smallest and largest.
struct RoundRange {
  double mean = 0, min = 0, max = 0;
};

/// One policy's figures over the sweep's instances.
struct SweepRow {
  std::string policy;
  stats::Estimate kl;             ///< the workflow's KL per position, nats (QualityVariant::workflow)
  double agreement = 0;           ///< greedy agreement with the baseline's tokens
  double computed = 0;            ///< tokens computed, mean per instance
  double ttft_ms = 0, e2e_ms = 0;  ///< mean per instance over the rounds
  RoundRange ttft_speedup, e2e_speedup;  ///< the baseline's time over this policy's, per round
  double gap_closed = 0;    ///< 1 - kl / (none's kl): the share of `none`'s distance to the baseline removed
  double speedup_kept = 0;  ///< mean TTFT speed-up over `none`'s: the share of choreo's speed-up kept
  bool frontier = false;    ///< on the Pareto frontier of (computed, kl)
};

/// What a sweep found.
struct RepairSweep {
  std::string workflow, model;
  size_t instances = 0;
  int rounds = 0;
  double baseline_computed = 0, baseline_ttft_ms = 0, baseline_e2e_ms = 0;  ///< mean per instance
  std::vector<SweepRow> rows;  ///< in the order of the variants; `none` first
  double max_kl = 0;           ///< the bound the choice was made under
  bool max_kl_given = false;   ///< --max-kl; else half of `none`'s KL (the bound closing half the gap)
  std::optional<size_t> chosen;
};

/// The sweep's rows from a profile whose variants are policy_variants (the first is `none`), and the choice:
/// the policy computing the fewest tokens whose workflow KL is at most `max_kl` (ties: lower KL, then first),
/// with `max_kl` half of `none`'s KL when not given. No choice when no policy is under the bound.
RepairSweep summarize_sweep(const QualityProfile& profile, int rounds, std::optional<double> max_kl);

/// Indices of the rows on the Pareto frontier of (x, KL): no other row has an x and a KL both lower or equal,
/// one of them strictly. Sorted by x; of rows with equal x and KL the first is kept.
std::vector<size_t> pareto_rows(std::span<const double> x, std::span<const double> kl);

/// The sweep as a Markdown table with a line above saying what was compared and a line below naming the
/// choice.
std::string sweep_table(const RepairSweep& sweep);

/// The x axis of sweep_svg.
enum class SweepAxis { Computed, Ttft };

/// An SVG scatter: one point per policy (x: tokens computed per instance, or TTFT in ms; y: KL), labelled,
/// the frontier over that x drawn as a line, the chosen policy ringed (class="chosen"), and the bound as a
/// dashed line.
std::string sweep_svg(const RepairSweep& sweep, SweepAxis x);

/// The chosen policy's file: {"choreo_repair_policy": 1, "policy": NAME, ...its figures and the bound}.
nlohmann::ordered_json repair_policy_json(const RepairSweep& sweep);

/// Reads a file repair_policy_json wrote: its policy. InputError at the file for anything else.
RepairPolicy read_repair_policy_file(const std::string& path);

/// Writes into `dir` (created): sweep.md (sweep_table), sweep.json (`quality` as quality_json, and the
/// rows), pareto_computed.svg and pareto_ttft.svg, and repair.json when a policy was chosen.
void write_sweep(const RepairSweep& sweep, const QualityProfile& profile, const std::string& dir);

}  // namespace choreo::eval
