#include "dsl/flow.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <deque>
#include <set>
#include <stdexcept>

namespace choreo::dsl {

namespace {

/// True when a message private to `owner` may not reach `reader`.
bool is_foreign(const std::string& owner, const std::string& reader) {
  return !owner.empty() && owner != reader;
}

/// The carried set of one message, given the sets of all earlier ones.
std::vector<size_t> carried_by(std::span<const FlowMessage> messages, size_t i,
                               const std::vector<std::vector<size_t>>& carried) {
  std::set<size_t> out;
  for (size_t p : messages[i].parents) {
    assert(p < i);
    if (!messages[p].private_to.empty()) out.insert(p);
    out.insert(carried[p].begin(), carried[p].end());
  }
  out.erase(i);
  return {out.begin(), out.end()};
}

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
  std::vector<std::vector<size_t>> carried(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) carried[i] = carried_by(messages, i, carried);
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
  index_[message.name] = messages_.size();
  messages_.push_back(std::move(message));
  carried_.push_back(carried_by(messages_, messages_.size() - 1, carried_));
  return messages_.size() - 1;
}

std::vector<std::string> FlowTracker::leaking_parents(const std::string& reader,
                                                      std::span<const std::string> parents) const {
  std::vector<std::string> out;
  for (const std::string& parent : parents) {
    const size_t i = index_of(parent);
    const bool leaks = std::any_of(carried_[i].begin(), carried_[i].end(), [&](size_t source) {
      return is_foreign(messages_[source].private_to, reader);
    });
    if (leaks && std::find(out.begin(), out.end(), parent) == out.end()) out.push_back(parent);
  }
  return out;
}

std::vector<std::string> FlowTracker::foreign_private(const std::string& reader,
                                                      const std::string& name) const {
  std::vector<std::string> out;
  for (size_t source : carried_[index_of(name)])
    if (is_foreign(messages_[source].private_to, reader)) out.push_back(messages_[source].name);
  return out;
}

size_t FlowTracker::clean_at(size_t id, const std::string& reader) {
  const bool leaks = std::any_of(carried_[id].begin(), carried_[id].end(), [&](size_t source) {
    return is_foreign(messages_[source].private_to, reader);
  });
  if (!leaks) return id;
  if (auto it = cleaned_.find({id, reader}); it != cleaned_.end()) return it->second;
  // Copies: cleaning a parent appends to messages_.
  const FlowMessage original = messages_[id];
  FlowMessage fresh{fmt::format("{} for {}", original.name, reader.empty() ? "no agent" : reader),
                    original.agent,
                    original.private_to,
                    {},
                    original.is_call};
  for (size_t p : original.parents) {
    if (is_foreign(messages_[p].private_to, reader)) continue;  // the leak itself: dropped
    fresh.parents.push_back(clean_at(p, reader));
  }
  const size_t out = append(std::move(fresh));
  cleaned_[{id, reader}] = out;
  return out;
}

std::string FlowTracker::clean(const std::string& name, const std::string& reader) {
  return messages_[clean_at(index_of(name), reader)].name;
}

std::vector<std::string> FlowTracker::parents_of(const std::string& name) const {
  std::vector<std::string> out;
  for (size_t p : messages_[index_of(name)].parents) out.push_back(messages_[p].name);
  return out;
}

}  // namespace choreo::dsl
