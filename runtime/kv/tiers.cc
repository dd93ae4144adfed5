#include "runtime/kv/tiers.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <tuple>
#include <utility>

#include "common/error.h"

namespace choreo::kv {

std::string_view policy_name(EvictionPolicy p) {
  return p == EvictionPolicy::Lru ? "lru" : "workflow";
}

EvictionPolicy parse_eviction_policy(std::string_view name) {
  if (name == "lru") return EvictionPolicy::Lru;
  if (name == "workflow") return EvictionPolicy::Workflow;
  throw InputError(fmt::format("unknown eviction policy '{}'", name), "use lru or workflow");
}

bool HostTier::charge(size_t bytes) {
  if (!fits(bytes)) return false;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return true;
}

HostCopy::HostCopy(HostTier& tier, kernels::Backend& backend, size_t n_pages, size_t page_bytes)
    : tier_(&tier), backend_(&backend), n_pages_(n_pages), page_bytes_(page_bytes) {
  data_ = static_cast<std::byte*>(backend.alloc_host(n_pages * page_bytes));
  tier_->in_use_ += bytes();
  tier_->peak_ = std::max(tier_->peak_, tier_->in_use_);
}

HostCopy& HostCopy::operator=(HostCopy&& other) noexcept {
  if (this != &other) {
    reset();
    tier_ = other.tier_;
    backend_ = other.backend_;
    data_ = std::exchange(other.data_, nullptr);
    n_pages_ = other.n_pages_;
    page_bytes_ = other.page_bytes_;
    other.tier_ = nullptr;
    other.backend_ = nullptr;
    other.n_pages_ = other.page_bytes_ = 0;
  }
  return *this;
}

void HostCopy::reset() {
  if (data_ && tier_) tier_->in_use_ -= bytes();
  if (data_) backend_->release_host(data_);
  data_ = nullptr;
  tier_ = nullptr;
  backend_ = nullptr;
  n_pages_ = page_bytes_ = 0;
}

Retention merged(const Retention& a, const Retention& b) {
  Retention out;
  out.pin = a.pin || b.pin;
  out.priority = std::max(a.priority, b.priority);
  if (a.ttl_ms && b.ttl_ms) out.ttl_ms = std::max(*a.ttl_ms, *b.ttl_ms);
  out.release = a.release && b.release;
  return out;
}

void order_for_eviction(std::vector<EvictionCandidate>& candidates, EvictionPolicy policy) {
  // Never-read-again sorts as the largest distance.
  auto distance = [](const EvictionCandidate& c) { return c.steps.value_or(SIZE_MAX); };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const EvictionCandidate& a, const EvictionCandidate& b) {
    if (a.released != b.released) return a.released;
    if (a.priority != b.priority) return a.priority < b.priority;
    if (policy == EvictionPolicy::Workflow) {
      if (distance(a) != distance(b)) return distance(a) > distance(b);
      if (a.shared != b.shared) return !a.shared;
    }
    return std::tie(a.last_use, a.id) < std::tie(b.last_use, b.id);
  });
}

std::string track_name(const TierEvent& e) {
  const std::string t = "T" + std::to_string(e.tier);
  switch (e.kind) {
    case TierEvent::Kind::Offload: return "evict to " + t;
    case TierEvent::Kind::Write: return "write " + t;
    case TierEvent::Kind::Load: return t + "->T0";
    case TierEvent::Kind::Prefetch: return t + "->T0 prefetch";
    case TierEvent::Kind::Recompute: return "recompute";
  }
  return "?";
}

}  // namespace choreo::kv
