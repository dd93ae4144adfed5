#pragma once
// The report of a cross-model KV reuse sweep (`choreo profile reuse`, after DroidSpeak): a receiver model
// recomputes some transformer layers and reuses a sender model's KV for the rest. Each "partial recompute"
// plan is scored against full recompute; this file turns those scores into losses, the Pareto frontier of
// (recomputed layers, loss), the cheapest plan within a loss budget, and SVG figures and JSON for people.
//
// A loss that is NaN or infinite counts as missing: the plan is never on the frontier, never chosen, and is
// drawn as a blank cell or not at all.

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/model_set.h"

namespace choreo::eval {

/// A recomputed layer range [begin, end) (the engine's).
using LayerRange = runtime::LayerRange;

/// One plan's scores, averaged over the items it ran on.
struct PlanScore {
  // The layers the receiver recomputes: empty = "reuse"; {[0, L)} = "recompute".
  std::vector<LayerRange> ranges;
  // Mean token-F1 of the plan's greedy output against recompute's greedy output, in [0, 1].
  double token_f1 = 0;
  double kl = 0;          // mean KL divergence (nats) of next-token distributions over recompute's answer
  double metric = 0;      // mean dataset metric against gold answers, in [0, 1]
  double prefill_ms = 0;  // mean time to first token of the receiver's call, including making its encoding
  int n = 0;              // items scored
};

/// The number of layers the plan recomputes: the sum of (end - begin) over its ranges.
int recomputed_layers(const PlanScore& plan);
/// "reuse" (no ranges), "recompute" (exactly {[0, n_layers)}), else "partial [10, 15)" or
/// "partial [3, 4) [7, 8)".
std::string describe_plan(std::span<const LayerRange> ranges, int n_layers);

/// What a plan's loss against recompute is measured by.
enum class Quality { f1, kl, metric };

/// "f1", "kl" or "metric".
std::string_view quality_name(Quality q);
/// The quality called `name`; InputError with a hint listing the names otherwise.
Quality parse_quality(std::string_view name);

/// The loss of `plan` relative to `recompute` under `q`: f1 -> 1 - plan.token_f1; kl -> plan.kl;
/// metric -> max(0, recompute.metric - plan.metric) (an absolute drop on the 0..1 scale).
/// NaN scores give NaN, and so does a plan or reference scored on no item (n == 0).
double quality_loss(Quality q, const PlanScore& plan, const PlanScore& recompute);

/// Indices of the plans on the Pareto frontier of (recomputed layers, loss): a plan is on it when no other
/// plan has fewer-or-equal recomputed layers and a lower-or-equal loss with at least one strictly better.
/// Sorted by recomputed layers. Ties (same layers and same loss): keep the first.
/// `losses[i]` is the loss of `plans[i]`.
std::vector<size_t> pareto_frontier(std::span<const PlanScore> plans, std::span<const double> losses);
/// The cheapest plan (fewest recomputed layers; then lowest loss; then first) with loss <= max_loss,
/// or nullopt.
std::optional<size_t> choose_plan(std::span<const PlanScore> plans, std::span<const double> losses,
                                  double max_loss);

/// DroidSpeak Fig. 12: an SVG heatmap, x = first recomputed layer s (0..n_layers-1), y = end layer e
/// (1..n_layers), one cell per single-range plan [s, e) present in `plans` (other cells with s < e are grey),
/// coloured by loss on a sequential scale from low (light) to high (dark red), with a legend giving the min
/// and max losses and the quality's name, the chosen plan outlined (class="chosen"), axis labels and a title.
/// Reuse (no ranges) and multi-range plans are not cells; the caption names the chosen plan, cell or not.
std::string heatmap_svg(std::span<const PlanScore> plans, std::span<const double> losses, int n_layers,
                        Quality q, std::optional<size_t> chosen, std::string_view title);
/// The frontier as an SVG scatter: every plan as a grey point (x = recomputed layers 0..n_layers, y = loss),
/// frontier plans as connected dark points, the chosen plan ringed (class="chosen"), axes with ticks
/// and labels.
std::string frontier_svg(std::span<const PlanScore> plans, std::span<const double> losses,
                         std::span<const size_t> frontier, int n_layers, Quality q,
                         std::optional<size_t> chosen, std::string_view title);
/// JSON of plans: [{plan: describe_plan, ranges: [[s,e],...], recomputed_layers, token_f1, kl, metric,
/// prefill_ms, n, loss}], with a missing (non-finite) loss as null.
nlohmann::ordered_json plans_json(std::span<const PlanScore> plans, std::span<const double> losses,
                                  int n_layers);

}  // namespace choreo::eval
