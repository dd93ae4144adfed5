#pragma once
// What `choreo serve`'s clients say about the future of their messages, told to the engine's KV tiers as a
// step oracle (runtime/engine/step_oracle.h), which orders eviction and prefetch:
//
// - retention hints (choreo.retention): `pin` keeps a message in T0 for a lease that starts again on each
// hit,
//   within a budget of pinned bytes (SGLang's pins were reverted for lack of both; Mooncake's soft pins have
//   them); `ttl`: unused this long, it leaves first; `priority`: lower leaves first.
// - KVFlow's step graph (choreo.workflow_id, agent_id, step_id, next): a message is read by every agent whose
//   requests named it or made it; its steps to execution are the least that the workflow's latest `next`
//   gives those agents (`--evict workflow` evicts the message read furthest ahead first, never-again ones
//   before all; `--prefetch-steps` loads back those due within that many steps).
//
// Used on the engine thread only: the decoder tells it, and the tier manager asks it while the engine runs.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/engine/step_oracle.h"
#include "runtime/serve/choreo_request.h"

namespace choreo::serve {

/// The bounds on pins.
struct PinLimits {
  size_t max_bytes = 0;                 // T0 bytes pinned messages may hold at once (0: no pins)
  std::chrono::seconds max_lease{600};  // the longest a pin lasts after its last hit
};

/// What the hints did so far (GET /metrics).
struct HintStats {
  uint64_t pins_granted = 0;
  uint64_t pins_refused = 0;  // over the budget
  uint64_t pins_expired = 0;  // leases that ran out
};

class ServeHints : public runtime::StepOracle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ServeHints(PinLimits limits) : limits_(limits) {}

  /// Applies `hint` to message `id` (its KV is `bytes`), replacing an earlier one. False when it asked for a
  /// pin that the budget could not take: the rest of it applies.
  bool retain(kv::MessageId id, const RetentionHint& hint, size_t bytes);
  /// A request read message `id`: a pin's lease starts again.
  void hit(kv::MessageId id);
  /// A request of `ext.agent_id` in `ext.workflow_id` read or made `messages`; its `step_id` and `next`
  /// update the workflow's view of who runs when (a step older than the workflow's latest is ignored).
  void step(const ChoreoRequest& ext, std::span<const kv::MessageId> messages);

  std::optional<size_t> steps_to_execution(kv::MessageId message) const override;
  std::optional<kv::Retention> retention(kv::MessageId message) const override;

  /// Bytes held by pins whose leases run now.
  size_t pinned_bytes() const;
  const HintStats& stats() const { return stats_; }

 private:
  struct Hint {
    RetentionHint hint;
    bool pinned = false;  // a pin the budget took
    Clock::time_point lease_until{};
    size_t bytes = 0;
  };
  struct Workflow {
    std::optional<uint64_t> step;
    std::unordered_map<std::string, uint64_t> next;  // agent -> steps to execution
    uint64_t last_use = 0;
  };
  std::chrono::milliseconds lease(const RetentionHint& h) const;
  void expire_leases();

  PinLimits limits_;
  std::unordered_map<kv::MessageId, Hint> hints_;
  std::unordered_map<std::string, Workflow> workflows_;
  // message -> the (workflow, agent) pairs that read or made it
  std::unordered_map<kv::MessageId, std::vector<std::pair<std::string, std::string>>> readers_;
  uint64_t tick_ = 0;
  HintStats stats_;
};

}  // namespace choreo::serve
