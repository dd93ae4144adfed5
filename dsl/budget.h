#pragma once
// The work bound of one workflow run or check: every `repeat` iteration, every branch of a `for` fan-out and
// every call without one costs a step. `choreo run` (runtime/exec/interpreter.cc) and `choreo check`
// (dsl/plan/compile.cc) spend through this one type at the same places, and the check expands every
// iteration a run may reach, so a workflow that checks within its bound runs within it.
// docs/workflow-language.md, "Bounds".

#include <cstdint>

#include "dsl/workflow.h"
#include "common/error.h"

namespace choreo::dsl {

/// The default bound (`--max-steps`): far above real workflows (madpar spends 12 steps), far below a runaway
/// loop nest (three nested `repeat`s over range(1000) would spend 10^9).
inline constexpr int64_t kDefaultMaxSteps = 1'000'000;

/// Steps a run or check may still take; spending past the bound is an InputError at the loop or call.
class WorkBudget {
 public:
  /// `workflow` is quoted in errors; `max_steps` is the bound (at least 1).
  WorkBudget(const Workflow& workflow, int64_t max_steps);

  /// One iteration of `repeat` or one branch of a `for:` fan-out: `loop` is its `NAME in EXPR` header.
  void iteration(const Loop& loop);
  /// One call without a `for:` (at its `prefill:`/`decode:` key).
  void call(const Call& call);

  int64_t spent() const { return spent_; }
  int64_t max_steps() const { return max_steps_; }

 private:
  void spend(const SourceLocation& where, const char* what);

  const Workflow& workflow_;
  int64_t max_steps_;
  int64_t spent_ = 0;
};

}  // namespace choreo::dsl
