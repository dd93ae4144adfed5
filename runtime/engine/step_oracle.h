#pragma once
// How far away the next read of a cached message is, for the engine's KV tiers (workflow-aware eviction and
// prefetch, KVFlow). Every running workflow instance registers an oracle that answers for the messages it
// made (exec: the interpreter's StepClock over its plan, dsl/plan/steps_to_execution.h); the registry answers
// with the minimum over them, since a message shared by several instances is needed as soon as any of them
// needs it. Thread-safe: instances run on their own threads.

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

#include "runtime/kv/message_store.h"
#include "runtime/kv/tiers.h"

namespace choreo::runtime {

/// Steps until a message is next read by the workflow instance that answers (nullopt: not again, or not
/// a message of this instance).
class StepOracle {
 public:
  virtual ~StepOracle() = default;
  virtual std::optional<size_t> steps_to_execution(kv::MessageId message) const = 0;
  /// The workflow's retention hints for a message (nullopt: none, or not a message of this instance).
  virtual std::optional<kv::Retention> retention(kv::MessageId message) const { return std::nullopt; }
};

/// The oracles of the instances running on one engine.
class StepOracleRegistry {
 public:
  void add(const StepOracle* oracle) {
    std::lock_guard lock(mutex_);
    oracles_.push_back(oracle);
  }
  void remove(const StepOracle* oracle) {
    std::lock_guard lock(mutex_);
    oracles_.erase(std::remove(oracles_.begin(), oracles_.end(), oracle), oracles_.end());
  }
  /// The minimum over the registered oracles; nullopt when none expects to read `message` again.
  std::optional<size_t> steps_to_execution(kv::MessageId message) const {
    std::lock_guard lock(mutex_);
    std::optional<size_t> best;
    for (const StepOracle* o : oracles_)
      if (std::optional<size_t> s = o->steps_to_execution(message)) best = best ? std::min(*best, *s) : *s;
    return best;
  }
  /// The hints of every instance that gives some, combined: pinned if any pins it; the highest priority; a
  /// time-to-live only when every instance that reads it gives one (the longest); released only when all
  /// say so. nullopt when none gives hints.
  std::optional<kv::Retention> retention(kv::MessageId message) const {
    std::lock_guard lock(mutex_);
    std::optional<kv::Retention> out;
    bool all_ttl = true;
    for (const StepOracle* o : oracles_) {
      const std::optional<size_t> reads = o->steps_to_execution(message);
      const std::optional<kv::Retention> r = o->retention(message);
      if (!r) {
        if (reads) all_ttl = false;  // an instance that reads it without a ttl keeps it alive
        continue;
      }
      out = out ? kv::merged(*out, *r) : *r;
    }
    if (out && !all_ttl) out->ttl_ms.reset();
    return out;
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return oracles_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<const StepOracle*> oracles_;
};

}  // namespace choreo::runtime
