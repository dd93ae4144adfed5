#pragma once
// `choreo profile quality` over a workflow's instances (docs/profile.md, "How far from exact"): per instance
// a baseline run in prefix mode, then each variant (a way of running the workflow in choreo mode; plain
// choreo mode is the one `profile quality` runs) teacher-forced to the baseline's tokens and compared with it
// call by call (quality.h). The calls' figures are then summed up per step and per workflow: within an
// instance, means over the positions of the step's (the workflow's) calls; across instances, their mean with
// a 95% percentile-bootstrap interval (common/statistics.h, fixed seed).

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/statistics.h"
#include "dsl/workflow.h"
#include "runtime/engine/open_engine.h"
#include "runtime/eval/quality.h"

namespace choreo::eval {

/// A way of running the workflow in choreo mode that is compared with the baseline: its name (in reports and
/// JSON) and how it changes the choreo engine's options (unset: the options as given).
struct QualityVariant {
  std::string name = "choreo";
  std::function<void(runtime::EngineOptions&)> configure;
  /// Adapters stacked over the run's model for this variant only (the baseline and the other variants run
  /// the model as given): an adapter from `choreo finetune`, compared with the exact baseline of the model
  /// it was trained for.
  std::vector<runtime::AdapterFile> adapters;
};

/// One compared variant of choreo mode per policy (named by RepairPolicy::name), each for every call, over
/// what the workflow's `repair:` keys say.
std::vector<QualityVariant> policy_variants(std::span<const RepairPolicy> policies);

/// The variants `profile quality --repair POLICY` compares: choreo mode with no repair ("none") and with
/// `policy` (named by RepairPolicy::name), each for every call, over what the workflow's `repair:` keys say.
std::vector<QualityVariant> repair_variants(const RepairPolicy& policy);

/// The variants `profile quality --finetuned ADAPTER` compares: none, the adapter, and with `policy` (unless
/// none) the policy and both (named "adapter", POLICY and "adapter+POLICY").
std::vector<QualityVariant> finetune_variants(const runtime::AdapterFile& adapter, const RepairPolicy& policy);

/// One variant's run of one instance, compared with the baseline.
struct VariantRun {
  std::vector<CallQuality> calls;  ///< the decodes compared, in the baseline's order
  int computed = 0;                ///< tokens the whole run computed (static messages and prefills included)
  int n_unforced = 0;              ///< decodes with no baseline counterpart (run_teacher_forced)
  /// Per round (QualityOptions::rounds): the run's TTFT (the sum of its decode steps', exec::RunTiming) and
  /// end-to-end time, in ms.
  std::vector<double> ttft_ms, e2e_ms;
};

/// One instance: the line of its inputs row (0 without an inputs file), the baseline's computed tokens, and
/// each variant's run (in the order of the variants).
struct QualityInstance {
  int line = 0;
  int baseline_computed = 0;  ///< tokens the whole baseline run computed
  std::vector<double> baseline_ttft_ms, baseline_e2e_ms;  ///< per round, as VariantRun's
  std::vector<VariantRun> variants;
};

/// Runs one instance: `workflow` on `baseline` (an engine in prefix mode), then on each of `variants`
/// (engines in choreo mode) teacher-forced to the baseline's tokens, and compares every decode.
QualityInstance compare_instance(const dsl::Workflow& workflow, runtime::Engine& baseline,
                                 std::span<runtime::Engine* const> variants,
                                 const exec::RunArguments& arguments);

/// Another timed round of an instance compare_instance compared: the baseline again on `baseline`, then the
/// variants teacher-forced to its tokens, starting with variant `first` and taking the others in turn (so
/// that no variant always runs right after the baseline); appends each run's TTFT and end-to-end time to
/// `instance`. The calls are not compared again: the runs are deterministic.
void time_instance(const dsl::Workflow& workflow, runtime::Engine& baseline,
                   std::span<runtime::Engine* const> variants, const exec::RunArguments& arguments,
                   size_t first, QualityInstance& instance);

/// A step's or a workflow's figures for one variant. Per instance, each figure is the mean over the positions
/// of its calls (KL in nats, the rank of the baseline's token, agreement as a fraction); `kl`, `rank` and
/// `agreement` are the means over the instances that have positions, with their bootstrap intervals.
struct QualitySummary {
  std::string label;    ///< the step's label, or the workflow's name
  int n_positions = 0;  ///< positions compared, summed over instances
  stats::Estimate kl, rank, agreement;
  stats::Estimate exact_rank, exact_agreement;  ///< the same two figures of the baseline itself
  double kl_max = 0;                            ///< the largest KL at one position
  double baseline_computed = 0, computed = 0;   ///< tokens computed, mean per instance
};

/// What one variant gave over every instance: per step (in order of first occurrence) and for the workflow.
struct VariantQuality {
  std::string name;
  std::vector<QualitySummary> steps;
  QualitySummary workflow;
  int n_unforced = 0;  ///< summed over instances
  /// Time, mean per instance over every round (ms); and per round, the baseline's time over the variant's
  /// (each summed over the instances): the speed-up over the exact baseline.
  double ttft_ms = 0, e2e_ms = 0, baseline_ttft_ms = 0, baseline_e2e_ms = 0;
  std::vector<double> ttft_speedup, e2e_speedup;
};

/// Sums up the instances' runs of variant `variant` (an index into QualityInstance::variants).
VariantQuality summarize_variant(const std::vector<QualityInstance>& instances, size_t variant,
                                 const std::string& name, const std::string& workflow_name);

/// What profile_quality runs, and on what.
struct QualityOptions {
  /// The instances: exec::instance_rows of this inputs file, `arguments` and `input_fields`, at most `limit`.
  std::string inputs_path;
  exec::RunArguments arguments;
  std::map<std::string, std::string> input_fields;
  int limit = 10;
  runtime::ModelOptions models;  ///< the run's model; the workflow's `models:` are added after it
  /// The engines' options: the baseline's (in prefix mode) and, adjusted by each variant, the variants'
  /// (in choreo mode). Every instance gets fresh engines, so its figures do not depend on the rows before it.
  runtime::EngineOptions engine;
  std::vector<QualityVariant> variants = {QualityVariant{}};
  /// How many times each instance runs, for time: the first round compares the calls, every round is timed
  /// (time_instance). The models are warmed up first (runtime::warm_up), as `choreo profile` does.
  int rounds = 1;
  /// Where to write quality_json (checked writable before the models load; empty: nowhere). When an instance
  /// fails, the instances compared before it are written, marked incomplete, and the error is thrown.
  std::string json_path;
  /// Called after each instance (index, number of instances, its comparison): progress.
  std::function<void(size_t index, size_t count, const QualityInstance& instance)> on_instance;
};

/// What profile_quality measured.
struct QualityProfile {
  std::string workflow;    ///< the workflow's name
  std::string model_path;  ///< the run's model file
  std::vector<std::string> variant_names;
  std::vector<QualityInstance> instances;
  std::vector<VariantQuality> variants;  ///< the summaries, in the order of the variants
};

/// Compares `workflow`'s instances (from `options`): loads the models, then runs each instance with
/// compare_instance on fresh engines, and sums the comparisons up.
QualityProfile profile_quality(const dsl::Workflow& workflow, const QualityOptions& options);

/// The JSON document of `profile quality` (docs/profile.md): per variant the workflow's and the steps'
/// figures and every call's; every KL figure is under a key named `kl`.
nlohmann::ordered_json quality_json(const QualityProfile& profile);

}  // namespace choreo::eval
