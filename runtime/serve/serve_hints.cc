#include "runtime/serve/serve_hints.h"

#include <algorithm>

namespace choreo::serve {

namespace {

/// Workflows remembered at once (the least recently used go), and readers remembered per message.
constexpr size_t kMaxWorkflows = 4096;
constexpr size_t kMaxReadersPerMessage = 64;

}  // namespace

std::chrono::milliseconds ServeHints::lease(const RetentionHint& h) const {
  const std::chrono::milliseconds longest = limits_.max_lease;
  return h.ttl ? std::min(*h.ttl, longest) : longest;
}

void ServeHints::expire_leases() {
  const Clock::time_point now = Clock::now();
  for (auto& [id, h] : hints_)
    if (h.pinned && now >= h.lease_until) {
      h.pinned = false;
      ++stats_.pins_expired;
    }
}

size_t ServeHints::pinned_bytes() const {
  const Clock::time_point now = Clock::now();
  size_t bytes = 0;
  for (const auto& [id, h] : hints_)
    if (h.pinned && now < h.lease_until) bytes += h.bytes;
  return bytes;
}

bool ServeHints::retain(kv::MessageId id, const RetentionHint& hint, size_t bytes) {
  expire_leases();
  Hint& h = hints_[id];
  const bool was_pinned = h.pinned;
  h.hint = hint;
  h.bytes = bytes;
  h.pinned = false;
  if (!hint.pin) return true;
  // A pin renewed keeps its place in the budget; a new one needs room beside the others.
  if (!was_pinned && pinned_bytes() + bytes > limits_.max_bytes) {
    ++stats_.pins_refused;
    return false;
  }
  h.pinned = true;
  h.lease_until = Clock::now() + lease(hint);
  if (!was_pinned) ++stats_.pins_granted;
  return true;
}

void ServeHints::hit(kv::MessageId id) {
  const auto it = hints_.find(id);
  if (it == hints_.end() || !it->second.pinned) return;
  const Clock::time_point now = Clock::now();
  if (now < it->second.lease_until) it->second.lease_until = now + lease(it->second.hint);
}

void ServeHints::step(const ChoreoRequest& ext, std::span<const kv::MessageId> messages) {
  if (ext.workflow_id.empty()) return;
  Workflow& w = workflows_[ext.workflow_id];
  w.last_use = ++tick_;
  if (!ext.step_id || !w.step || *ext.step_id >= *w.step) {
    if (ext.step_id) w.step = ext.step_id;
    if (!ext.next.empty() || ext.step_id) w.next = {ext.next.begin(), ext.next.end()};
  }
  if (!ext.agent_id.empty())
    for (kv::MessageId id : messages) {
      std::vector<std::pair<std::string, std::string>>& readers = readers_[id];
      const std::pair<std::string, std::string> reader{ext.workflow_id, ext.agent_id};
      if (std::find(readers.begin(), readers.end(), reader) == readers.end() &&
          readers.size() < kMaxReadersPerMessage)
        readers.push_back(reader);
    }
  if (workflows_.size() > kMaxWorkflows) {
    auto oldest = std::min_element(workflows_.begin(), workflows_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    workflows_.erase(oldest);
  }
}

std::optional<size_t> ServeHints::steps_to_execution(kv::MessageId message) const {
  const auto it = readers_.find(message);
  if (it == readers_.end()) return std::nullopt;
  std::optional<size_t> best;
  for (const auto& [workflow, agent] : it->second) {
    const auto w = workflows_.find(workflow);
    if (w == workflows_.end()) continue;
    const auto steps = w->second.next.find(agent);
    if (steps == w->second.next.end()) continue;
    best = std::min(best.value_or(SIZE_MAX), size_t(steps->second));
  }
  return best;
}

std::optional<kv::Retention> ServeHints::retention(kv::MessageId message) const {
  const auto it = hints_.find(message);
  if (it == hints_.end()) return std::nullopt;
  const Hint& h = it->second;
  kv::Retention r;
  r.pin = h.pinned && Clock::now() < h.lease_until;
  r.priority = h.hint.priority;
  if (h.hint.ttl) r.ttl_ms = double(h.hint.ttl->count());
  return r;
}

}  // namespace choreo::serve
