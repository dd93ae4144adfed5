#include "dsl/flow.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <deque>
#include <set>
#include <stdexcept>

namespace choreo::dsl {

namespace {

bool is_foreign(const std::string& owner, const std::string& reader) { return FlowGraph::is_foreign(owner, reader); }

/// Shortest chains from each ancestor of `start` down to `start` (breadth-first over parents):
/// `next[a]` is the message one step closer to `start` on a shortest chain from ancestor `a`.
std::map<size_t, size_t> chains_to(std::span<const FlowMessage> messages, size_t start) {
  std::map<size_t, size_t> next;
  std::deque<size_t> queue{start};
  next[start] = start;
  while (!queue.empty()) {
    const size_t m = queue.front();
    queue.pop_front();
    for (size_t p : messages[m].parents) {
      if (next.count(p)) continue;
      next[p] = m;
      queue.push_back(p);
    }
  }
  return next;
}

}  // namespace

std::vector<std::vector<size_t>> carried_private(std::span<const FlowMessage> messages) {
  FlowGraph graph;
  for (const FlowMessage& m : messages) graph.add(m.private_to, m.parents);
  std::vector<std::vector<size_t>> carried;
  for (size_t i = 0; i < graph.size(); ++i) carried.push_back(graph.carried(i));
  return carried;
}

FlowReport analyze_flow(std::span<const FlowMessage> messages) {
  const std::vector<std::vector<size_t>> carried = carried_private(messages);
  FlowReport report;
  for (size_t reader = 0; reader < messages.size(); ++reader) {
    const FlowMessage& call = messages[reader];
    if (!call.is_call) continue;
    std::set<size_t> seen;  // a parent listed twice (overlapping candidates) is reported once
    for (size_t parent : call.parents) {
      if (!seen.insert(parent).second) continue;
      if (is_foreign(messages[parent].private_to, call.agent)) report.violations.push_back({parent, reader});
      std::map<size_t, size_t> chains;
      for (size_t source : carried[parent]) {
        if (!is_foreign(messages[source].private_to, call.agent)) continue;
        if (chains.empty()) chains = chains_to(messages, parent);
        Leak leak{source, {source}, reader};
        for (size_t m = source; m != parent;) leak.path.push_back(m = chains.at(m));
        report.leaks.push_back(std::move(leak));
      }
    }
  }
  return report;
}

std::vector<FlowMessage> flow_messages(const plan::Plan& plan) {
  std::vector<FlowMessage> out;
  out.reserve(plan.nodes.size());
  for (const plan::Node& node : plan.nodes) {
    FlowMessage m{node.name, node.agent, node.private_to, {}, node.kind != plan::NodeKind::Message};
    for (const plan::Edge& e : node.parents) m.parents.push_back(e.parent);
    out.push_back(std::move(m));
  }
  return out;
}

// ---- FlowGraph ---------------------------------------------------------------------------------------

size_t FlowGraph::add(std::string owner, std::vector<size_t> parents) {
  const size_t i = owners_.size();
  std::set<size_t> carried;
  for (size_t p : parents) {
    assert(p < i);
    if (!owners_[p].empty()) carried.insert(p);
    carried.insert(carried_[p].begin(), carried_[p].end());
  }
  owners_.push_back(std::move(owner));
  parents_.push_back(std::move(parents));
  carried_.emplace_back(carried.begin(), carried.end());
  return i;
}

bool FlowGraph::leaks_to(size_t i, const std::string& reader) const {
  return std::any_of(carried_[i].begin(), carried_[i].end(),
                     [&](size_t source) { return is_foreign(owners_[source], reader); });
}

size_t FlowGraph::clean(size_t i, const std::string& reader, const MakeFresh& make) {
  if (!leaks_to(i, reader)) return i;
  if (auto it = cleaned_.find({i, reader}); it != cleaned_.end()) return it->second;
  std::vector<std::optional<size_t>> parents;
  const std::vector<size_t> original = parents_[i];  // a copy: cleaning a parent adds messages
  for (size_t p : original)
    parents.push_back(is_foreign(owners_[p], reader) ? std::nullopt : std::optional(clean(p, reader, make)));
  const size_t out = make(i, parents);
  cleaned_[{i, reader}] = out;
  return out;
}

// ---- FlowTracker -------------------------------------------------------------------------------------

size_t FlowTracker::index_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::invalid_argument(fmt::format("FlowTracker: unknown message `{}`", name));
  return it->second;
}

void FlowTracker::add(const std::string& name, const std::string& agent, const std::string& private_to,
                      std::span<const std::string> parents) {
  FlowMessage m{name, agent, private_to, {}, true};
  for (const std::string& parent : parents) m.parents.push_back(index_of(parent));
  append(std::move(m));
}

size_t FlowTracker::append(FlowMessage message) {
  const size_t i = graph_.add(message.private_to, message.parents);
  index_[message.name] = i;
  messages_.push_back(std::move(message));
  return i;
}

std::vector<std::string> FlowTracker::leaking_parents(const std::string& reader,
                                                      std::span<const std::string> parents) const {
  std::vector<std::string> out;
  for (const std::string& parent : parents)
    if (graph_.leaks_to(index_of(parent), reader) && std::find(out.begin(), out.end(), parent) == out.end())
      out.push_back(parent);
  return out;
}

std::vector<std::string> FlowTracker::foreign_private(const std::string& reader,
                                                      const std::string& name) const {
  std::vector<std::string> out;
  for (size_t source : graph_.carried(index_of(name)))
    if (is_foreign(messages_[source].private_to, reader)) out.push_back(messages_[source].name);
  return out;
}

std::string FlowTracker::clean(const std::string& name, const std::string& reader) {
  const size_t i = graph_.clean(index_of(name), reader, [&](size_t original, const auto& parents) {
    const FlowMessage& o = messages_[original];
    FlowMessage fresh{fmt::format("{} for {}", o.name, reader.empty() ? "no agent" : reader), o.agent,
                      o.private_to, {}, o.is_call};
    for (const std::optional<size_t>& p : parents)
      if (p) fresh.parents.push_back(*p);
    return append(std::move(fresh));
  });
  return messages_[i].name;
}

std::vector<std::string> FlowTracker::parents_of(const std::string& name) const {
  std::vector<std::string> out;
  for (size_t p : messages_[index_of(name)].parents) out.push_back(messages_[p].name);
  return out;
}

}  // namespace choreo::dsl
