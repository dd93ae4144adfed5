#pragma once
// KVFlow's steps-to-execution over a compiled plan, kept current while a workflow runs. A workflow-aware KV
// cache evicts first what is needed last and prefetches what is needed next; this is where "next" comes
// from (runtime/engine/step_oracle.h hands it to the engine).
//
// A *step* is one plan batch (Plan::batches; the interpreter runs them one after another, in order). Each
// batch depends on the batch before it (program order) and on the batches that made its nodes' parents.
// With the steps completed so far, the distance of a future batch b is
//   steps(b) = 0                                 when everything b depends on is resolved (b runs next);
//   steps(b) = max over unresolved p it depends on of after(p)        (a join waits for its last parent),
// where after(p) = steps(p) + 1 for a batch that always runs, and steps(p) for a conditional batch, which
// may be skipped (the minimum over a conditional branch: taken or not). An agent's steps-to-execution is
// the minimum of steps(b) over its future batches; a message's is the minimum over the future calls that
// read it (candidates of a run-time choice included), i.e. over the agents that will read it next; nullopt
// when nothing will. Completing step s resolves s and every step before it (the ones the run skipped).

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "dsl/plan/plan.h"
#include "dsl/plan/step_graph.h"

namespace choreo::dsl::plan {

class StepClock {
 public:
  explicit StepClock(const Plan& plan);

  /// The run finished plan batch `step` (steps complete in increasing order; the ones between are skipped).
  void complete(size_t step);

  /// The first step not resolved yet (= the number of steps resolved).
  size_t now() const { return now_; }

  /// Steps from now until `step` runs (0: it is next); nullopt for a resolved step.
  std::optional<size_t> steps_until(size_t step) const;

  /// Steps until `agent` (StepGraph's name: `agent:`, else the `as` base name) next runs; nullopt: never.
  std::optional<size_t> for_agent(const std::string& agent) const;

  /// Steps until plan node `node`'s message is next read; nullopt: nothing will read it again.
  std::optional<size_t> for_message(size_t node) const;

  /// The agents of the plan's step graph, in order of first appearance.
  const std::vector<std::string>& agents() const { return graph_.agents; }

  const StepGraph& graph() const { return graph_; }

 private:
  void recompute();

  const Plan& plan_;
  StepGraph graph_;
  std::vector<std::vector<size_t>> depends_;  // per batch: the earlier batches it depends on
  std::vector<std::vector<size_t>> readers_;  // per node: the batches of the calls that list it as a parent
  std::vector<size_t> steps_;                 // per batch: steps(b), valid for b >= now_
  size_t now_ = 0;
};

}  // namespace choreo::dsl::plan
