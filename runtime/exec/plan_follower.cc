#include "runtime/exec/plan_follower.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>

namespace choreo::exec {

using dsl::plan::Batch;
using dsl::plan::Branch;
using dsl::plan::Edge;
using dsl::plan::Node;
using dsl::plan::NodeKind;

namespace {

/// Two edges from the same `parents:` entry.
bool same_place(const SourceLocation& a, const SourceLocation& b) {
  return a.line == b.line && a.col == b.col && a.file == b.file;
}

std::string offset_text(const std::optional<int64_t>& at, bool dynamic) {
  if (at) return std::to_string(*at);
  return dynamic ? "decided at run time" : "none";
}

}  // namespace

void PlanFollower::created(uint64_t id, size_t node) {
  std::lock_guard lock(ids_mutex_);
  std::vector<size_t>& nodes = nodes_of_id_[id];
  if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  ++pieces_[node];
}

std::vector<size_t> PlanFollower::nodes_of(uint64_t id) const {
  std::lock_guard lock(ids_mutex_);
  auto it = nodes_of_id_.find(id);
  return it == nodes_of_id_.end() ? std::vector<size_t>{} : it->second;
}

size_t PlanFollower::node_of(uint64_t id) const {
  const std::vector<size_t> nodes = nodes_of(id);
  return nodes.empty() ? SIZE_MAX : nodes.front();
}

bool PlanFollower::fits(const Batch& batch, const std::vector<Branch>& branches,
                        std::vector<size_t>& nodes) const {
  nodes.clear();
  size_t k = 0;
  for (size_t index : batch.nodes) {
    const Node& n = plan_.nodes[index];
    if (k < branches.size() && branches[k].node.name == n.name) {
      nodes.push_back(index);
      ++k;
    } else if (!n.conditional) {
      return false;  // the run skipped a call the plan says always runs
    }
  }
  return k == branches.size();
}

std::string PlanFollower::describe_plan(size_t index) const {
  const Node& n = plan_.nodes[index];
  std::vector<std::string> parents;
  for (const Edge& e : n.parents)
    parents.push_back(fmt::format("{}{}{}", e.selection ? "?" : "", plan_.nodes[e.parent].name,
                                  e.at || e.at_dynamic ? " at " + offset_text(e.at, e.at_dynamic) : ""));
  return fmt::format("{} `{}` (agent `{}`, step {}) with parents [{}], new_offset {}", kind_name(n.kind),
                     n.name, n.agent, n.batch, fmt::join(parents, ", "),
                     offset_text(n.new_offset, n.new_offset_dynamic));
}

std::string PlanFollower::describe_run(const Branch& run) const {
  std::vector<std::string> parents;
  for (const Edge& e : run.node.parents) {
    const size_t p = node_of(e.parent);
    parents.push_back(fmt::format("{}{}", p == SIZE_MAX ? "message #" + std::to_string(e.parent) : plan_.nodes[p].name,
                                  e.at ? " at " + std::to_string(*e.at) : ""));
  }
  return fmt::format("{} `{}` (agent `{}`) with parents [{}], new_offset {}", kind_name(run.node.kind),
                     run.node.name, run.node.agent, fmt::join(parents, ", "),
                     offset_text(run.node.new_offset, false));
}

void PlanFollower::compare(const Node& planned, size_t index, const Branch& run) const {
  auto fail = [&](std::string_view what) {
    throw PlanMismatch(fmt::format("internal error: `choreo run` does not follow the plan of {} ({}): the run "
                                   "issued {}; the plan has {}",
                                   plan_.file, what, describe_run(run), describe_plan(index)));
  };
  if (planned.kind != run.node.kind) fail("kind");
  if (planned.agent != "?" && planned.agent != run.node.agent) fail("agent");
  if (planned.private_to != "?" && planned.private_to != run.node.private_to) fail("owner");
  if (planned.new_offset ? run.node.new_offset != planned.new_offset
                         : !planned.new_offset_dynamic && run.node.new_offset)
    fail("new_offset");
  // Parents, one `parents:` entry at a time (an entry is the run of edges with the same location).
  const std::vector<Edge>& want = planned.parents;
  const std::vector<Edge>& got = run.node.parents;
  size_t i = 0, j = 0;
  while (i < want.size()) {
    const SourceLocation& entry = want[i].where;
    size_t i_end = i;
    while (i_end < want.size() && same_place(want[i_end].where, entry)) ++i_end;
    std::vector<size_t> seen;  // the run's parents from this entry, as plan nodes (a PML message once)
    const size_t j_begin = j;
    while (j < got.size() && same_place(got[j].where, entry)) {
      // One message may be several plan nodes (identical encodings): take the one this place wants.
      const std::vector<size_t> nodes = nodes_of(got[j].parent);
      if (nodes.empty()) fail("a parent the plan does not know");
      auto wanted = [&](size_t node) {
        if (want[i].selection)
          return std::any_of(want.begin() + long(i), want.begin() + long(i_end),
                             [&](const Edge& e) { return e.parent == node; });
        const size_t k = i + seen.size();
        return k < i_end && want[k].parent == node;
      };
      auto match = std::find_if(nodes.begin(), nodes.end(), wanted);
      const size_t p = match != nodes.end() ? *match : nodes.front();
      auto pieces = pieces_.find(p);
      const size_t n = plan_.nodes[p].pml && pieces != pieces_.end() ? pieces->second : 1;
      seen.push_back(p);
      j += std::max<size_t>(n, 1);
    }
    if (j > got.size()) fail("parents");
    const std::optional<int64_t> run_at = j > j_begin ? got[j_begin].at : std::nullopt;
    if (want[i].at ? run_at != want[i].at : !want[i].at_dynamic && run_at) fail("parent offset");
    if (want[i].selection) {
      for (size_t p : seen)
        if (std::none_of(want.begin() + long(i), want.begin() + long(i_end),
                         [&](const Edge& e) { return e.parent == p; }))
          fail("a run-time choice outside the plan's candidates");
    } else {
      if (seen.size() != i_end - i) fail("parents");
      for (size_t k = 0; k < seen.size(); ++k)
        if (want[i + k].parent != seen[k]) fail("parents");
    }
    i = i_end;
  }
  if (j != got.size()) fail("parents");
}

size_t PlanFollower::match(NodeKind kind, const std::vector<Branch>& branches) {
  std::vector<size_t> nodes;
  for (size_t b = next_batch_; b < plan_.batches.size(); ++b) {
    const Batch& batch = plan_.batches[b];
    if (batch.kind == kind && fits(batch, branches, nodes)) {
      for (size_t k = 0; k < branches.size(); ++k) compare(plan_.nodes[nodes[k]], nodes[k], branches[k]);
      next_batch_ = b + 1;
      nodes_ = std::move(nodes);
      return b;
    }
    if (!batch.conditional) {
      std::vector<std::string> names;
      for (const Branch& br : branches) names.push_back(br.node.name);
      std::vector<std::string> expected;
      for (size_t index : batch.nodes) expected.push_back(plan_.nodes[index].name);
      throw PlanMismatch(fmt::format(
          "internal error: `choreo run` does not follow the plan of {}: the run issued a {} batch [{}] where "
          "the plan's step {} is a {} batch [{}] that always runs",
          plan_.file, kind_name(kind), fmt::join(names, ", "), b, kind_name(batch.kind), fmt::join(expected, ", ")));
    }
  }
  std::vector<std::string> names;
  for (const Branch& br : branches) names.push_back(br.node.name);
  throw PlanMismatch(fmt::format("internal error: `choreo run` does not follow the plan of {}: the run issued a "
                                 "{} batch [{}] after the plan's last step",
                                 plan_.file, kind_name(kind), fmt::join(names, ", ")));
}

}  // namespace choreo::exec
