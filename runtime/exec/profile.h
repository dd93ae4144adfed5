#pragma once
// `choreo profile` (DESIGN.md §7): each instance runs twice — in the baseline `prefix` mode (plain chat calls
// with prefix caching) and in `choreo` mode forced to generate, call by call, exactly as many tokens as the
// baseline did — so that time differences come from what each path computes, not from what it generates.

#include <string>
#include <vector>

#include "dsl/workflow.h"
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

}  // namespace choreo::exec
