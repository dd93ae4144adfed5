#pragma once
// Run and plan agree, checked while running (DESIGN.md §1). `choreo run` compiles the plan of the workflow
// with the run's own arguments before its first call, and the follower checks every batch the run then
// issues against it: the batch must be the next plan batch of its kind, skipping only batches the plan marks
// conditional, and each call in it must be the plan node of the same name, with the same parents (a
// run-time choice: one of the plan's candidates), offsets and agent. A difference is an internal error
// naming both sides, never a silent one. The follower also maps the run's message ids to plan nodes, which
// is how the step clock (dsl/plan/step_graph.h) and the trace learn which plan step just ran.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsl/plan/elaborate.h"
#include "dsl/plan/plan.h"

namespace choreo::exec {

/// A run that does not follow its plan: a bug, reported with both sides.
class PlanMismatch : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

class PlanFollower {
 public:
  explicit PlanFollower(const dsl::plan::Plan& plan) : plan_(plan) {}

  /// Checks the batch the run is about to issue (each branch's parents name run message ids) and returns
  /// the index of the plan batch it is; `nodes()` then gives each branch's plan node. Throws PlanMismatch.
  size_t match(dsl::plan::NodeKind kind, const std::vector<dsl::plan::Branch>& branches);

  /// The plan nodes of the branches of the last matched batch, in order.
  const std::vector<size_t>& nodes() const { return nodes_; }

  /// Records that the run's message `id` is (a piece of) plan node `node`.
  void created(uint64_t id, size_t node);

  /// The plan node of a run message id, or SIZE_MAX when the run made it outside the plan (none should be).
  /// Identical encodings share one message, so one id can be several plan nodes: this is the first of them.
  size_t node_of(uint64_t id) const;
  /// Every plan node a run message id is, in the order the run made them (empty outside the plan).
  /// Thread-safe against created(): the engine's thread asks (KV tiers) while the run's thread records.
  std::vector<size_t> nodes_of(uint64_t id) const;

  const dsl::plan::Plan& plan() const { return plan_; }

 private:
  bool fits(const dsl::plan::Batch& batch, const std::vector<dsl::plan::Branch>& branches,
            std::vector<size_t>& nodes) const;
  void compare(const dsl::plan::Node& planned, size_t index, const dsl::plan::Branch& run) const;
  std::string describe_run(const dsl::plan::Branch& run) const;
  std::string describe_plan(size_t index) const;

  const dsl::plan::Plan& plan_;
  size_t next_batch_ = 0;
  std::vector<size_t> nodes_;
  mutable std::mutex ids_mutex_;  // guards nodes_of_id_
  std::map<uint64_t, std::vector<size_t>> nodes_of_id_;
  std::map<size_t, size_t> pieces_;  // plan node -> how many run messages it is (PML: its pieces)
};

}  // namespace choreo::exec
