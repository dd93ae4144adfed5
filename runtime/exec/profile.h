#pragma once
// `choreo profile` (DESIGN.md §7): each instance runs twice — in the baseline `prefix` mode (plain chat calls
// with prefix caching) and in `choreo` mode forced to generate, call by call, exactly as many tokens as the
// baseline did — so that time differences come from what each path computes, not from what it generates.
// profile_workflow does that for every instance of a workflow and sums the runs up (docs/profile.md).

#include <cstddef>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/statistics.h"
#include "dsl/workflow.h"
#include "runtime/engine/open_engine.h"
#include "runtime/exec/instances.h"
#include "runtime/exec/interpreter.h"

namespace choreo::exec {

/// One batch of decodes (a step) of a run: its label (`answer[1][*]`: indices that vary within the batch
/// become `*`), time to first token, and work.
struct StepTiming {
  std::string label;
  int size = 0;
  double ttft_ms = 0;  ///< submission to the first generated token (shared by the batch's branches)
  double total_ms = 0;
  int n_computed = 0, n_reused = 0, n_generated = 0;
};

/// Totals of one run.
struct RunTiming {
  double ttft_ms = 0;  ///< sum of the decode steps' TTFT
  double e2e_ms = 0;   ///< first submission to the last result
  int n_computed = 0, n_reused = 0, n_generated = 0;
  std::vector<StepTiming> steps;  ///< decode steps in execution order
};

/// One decode batch of a finished run: its step label and its messages (indices into RunResult::messages).
struct DecodeBatch {
  std::string label;
  std::vector<size_t> messages;
};

/// The decode batches of a finished run in order of submission (decodes submitted together share a start
/// time).
std::vector<DecodeBatch> decode_batches(const RunResult& result);

/// The decode steps and totals of a finished run.
RunTiming timing_of(const RunResult& result);

/// Baseline and choreo runs of one instance.
struct ProfiledInstance {
  RunResult baseline, choreo;
  RunTiming baseline_timing, choreo_timing;
  int n_unforced = 0;  ///< choreo decodes with no baseline decode of the same name (control flow diverged)
};

/// Runs one instance on `baseline` (an engine in prefix or naive mode), then on `choreo` (an engine in choreo
/// mode) with each decode forced to the baseline's generated-token count for the decode of the same name.
ProfiledInstance profile_instance(const dsl::Workflow& workflow, runtime::Engine& baseline, runtime::Engine& choreo,
                                  const RunArguments& arguments);

/// What profile_workflow runs, and on what.
struct WorkflowProfileOptions {
  /// The instances: one per row of this JSON Lines file (exec::read_input_rows, with `arguments` shared by
  /// every row and `input_fields` mapping inputs to row keys); empty: one instance of `arguments`.
  std::string inputs_path;
  RunArguments arguments;
  std::map<std::string, std::string> input_fields;
  int limit = 10;  ///< instances to run from `inputs_path` (0: all)
  /// The run's model (model 0, with its adapters); the workflow's `models:` are added after it.
  runtime::ModelOptions models;
  /// The choreo engine; the baseline engine is opened with the same options in `baseline_mode`.
  runtime::EngineOptions engine;
  runtime::Mode baseline_mode = runtime::Mode::Prefix;  ///< prefix or naive (InputError otherwise)
  /// A fresh choreo engine per instance; otherwise one engine across instances, so that later instances reuse
  /// what earlier ones encoded (as `run --inputs` and `eval` do). The baseline is always fresh per instance:
  /// a chat API call shares nothing with the previous row.
  bool cold = false;
  /// Where to write profile_json (checked writable before the models load; empty: nowhere). When an instance
  /// fails, the instances measured before it are written, marked incomplete, and the error is thrown.
  std::string json_path;
  /// Called after each instance (index, number of instances, its runs): progress.
  std::function<void(size_t index, size_t count, const ProfiledInstance& runs)> on_instance;
};

/// One instance of a profile: the line of its inputs row (0 without an inputs file) and its two runs.
struct ProfiledRow {
  int line = 0;
  ProfiledInstance runs;
};

/// One decode step summed over the instances whose both runs have it: matched by label and order of
/// occurrence (the second `answer[*]` of a run is `answer[*] #2`).
struct StepSummary {
  std::string label;
  int n = 0;  ///< instances summed
  double baseline_ttft_ms = 0, choreo_ttft_ms = 0;
  double baseline_computed = 0, choreo_computed = 0, baseline_reused = 0, choreo_reused = 0;
};

/// Means per instance of a profile's runs.
struct ProfileMeans {
  double baseline_ttft_ms = 0, choreo_ttft_ms = 0, baseline_e2e_ms = 0, choreo_e2e_ms = 0;
  double baseline_computed = 0, choreo_computed = 0, baseline_reused = 0, choreo_reused = 0;
  double generated = 0;  ///< by each run (the choreo run is forced to the baseline's counts)
};

/// What profile_workflow measured.
struct WorkflowProfile {
  std::string workflow;    ///< the workflow's name
  std::string model_path;  ///< the run's model file
  runtime::Mode baseline_mode = runtime::Mode::Prefix;
  std::vector<ProfiledRow> instances;
  std::vector<StepSummary> steps;  ///< in order of first occurrence
  ProfileMeans means;
  stats::RatioEstimate ttft, e2e;  ///< baseline/choreo ratios of the means, with bootstrap intervals
  int n_unforced = 0;              ///< summed over instances (ProfiledInstance::n_unforced)
};

/// Profiles `workflow` (its instances from `options`): loads the models, warms them up, then runs each
/// instance with profile_instance on a fresh baseline engine and the choreo engine, and sums the runs up.
WorkflowProfile profile_workflow(const dsl::Workflow& workflow, const WorkflowProfileOptions& options);

/// The JSON document of `profile` (docs/profile.md): its instances' timings and outputs, and the ratios.
nlohmann::ordered_json profile_json(const WorkflowProfile& profile);

}  // namespace choreo::exec
