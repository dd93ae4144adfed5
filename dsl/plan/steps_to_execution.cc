#include "dsl/plan/steps_to_execution.h"

#include <algorithm>
#include <set>

namespace choreo::dsl::plan {

StepClock::StepClock(const Plan& plan)
    : plan_(plan), graph_(agent_step_graph(plan)), depends_(plan.batches.size()), readers_(plan.nodes.size()),
      steps_(plan.batches.size(), 0) {
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    std::set<size_t> on;
    if (b > 0) on.insert(b - 1);
    for (size_t node : plan.batches[b].nodes)
      for (const Edge& e : plan.nodes[node].parents) {
        if (plan.nodes[e.parent].batch < b) on.insert(plan.nodes[e.parent].batch);
        readers_[e.parent].push_back(b);
      }
    depends_[b].assign(on.begin(), on.end());
  }
  for (std::vector<size_t>& r : readers_) {
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
  }
  recompute();
}

void StepClock::recompute() {
  for (size_t b = now_; b < steps_.size(); ++b) {
    size_t s = 0;
    for (size_t p : depends_[b]) {
      if (p < now_) continue;  // resolved
      s = std::max(s, steps_[p] + (plan_.batches[p].conditional ? 0 : 1));
    }
    steps_[b] = s;
  }
}

void StepClock::complete(size_t step) {
  if (step < now_ || step >= steps_.size()) return;
  now_ = step + 1;
  recompute();
}

std::optional<size_t> StepClock::steps_until(size_t step) const {
  if (step < now_ || step >= steps_.size()) return std::nullopt;
  return steps_[step];
}

std::optional<size_t> StepClock::for_agent(const std::string& agent) const {
  auto it = graph_.steps.find(agent);
  if (it == graph_.steps.end()) return std::nullopt;
  std::optional<size_t> best;
  for (const AgentStep& s : it->second)
    if (std::optional<size_t> d = steps_until(s.step)) best = best ? std::min(*best, *d) : *d;
  return best;
}

std::optional<size_t> StepClock::for_message(size_t node) const {
  if (node >= readers_.size()) return std::nullopt;
  std::optional<size_t> best;
  for (size_t b : readers_[node])
    if (std::optional<size_t> d = steps_until(b)) best = best ? std::min(*best, *d) : *d;
  return best;
}

}  // namespace choreo::dsl::plan
