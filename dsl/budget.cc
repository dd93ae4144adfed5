#include "dsl/budget.h"

#include <fmt/format.h>

namespace choreo::dsl {

WorkBudget::WorkBudget(const Workflow& workflow, int64_t max_steps) : workflow_(workflow), max_steps_(max_steps) {
  if (max_steps < 1) throw InputError(fmt::format("--max-steps must be at least 1, got {}", max_steps));
}

void WorkBudget::iteration(const Loop& loop) { spend(loop.where, "this loop"); }

void WorkBudget::call(const Call& call) { spend(call.where, "this call"); }

void WorkBudget::spend(const SourceLocation& where, const char* what) {
  if (++spent_ <= max_steps_) return;
  throw InputError(fmt::format("{} takes the workflow past its work bound of {} step{} (loop iterations and calls)",
                               what, max_steps_, max_steps_ == 1 ? "" : "s"),
                   "make the loops smaller, or raise the bound with --max-steps N",
                   where, workflow_.source_line(where.line));
}

}  // namespace choreo::dsl
