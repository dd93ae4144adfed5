#pragma once
// The prefix cache of `choreo serve`'s plain requests: KV-cache sessions (runtime/model/session.h, the run
// `choreo generate` makes), kept after their requests end so that a later prompt starting with the same tokens
// evaluates only the rest. A prompt takes the session holding its longest cached prefix: when that session's
// tokens are all a prefix of the prompt (an agent continuing its conversation) it is extended in place; else the
// prefix is copied into another session, so the first one keeps its own continuation for its own agent.
//
// A session's KV depends only on its tokens (batch-invariant kernels, one contiguous sequence), so a request
// answered from the cache gets exactly the logits of a fresh run: the output of `choreo generate --chat`.
// Sessions share the engine's page pool and budget; idle ones are dropped, least recently used first, when the
// pool runs short. Used on the engine thread only (runtime/serve/engine_service.h).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/model_set.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/session.h"

namespace choreo::serve {

/// What the session cache did so far (GET /metrics).
struct SessionCacheStats {
  uint64_t acquired = 0;
  uint64_t extended = 0;       // a prompt extended a session's own tokens in place
  uint64_t copied = 0;         // a prompt's prefix was copied from another session
  uint64_t copied_tokens = 0;
  uint64_t dropped = 0;        // idle sessions dropped for room
};

class SessionCache {
 public:
  SessionCache(const runtime::ModelSet& models, kv::PagePool& pool) : models_(models), pool_(pool) {}

  /// A session of `model` holding the longest cached prefix of `tokens`, at most all but the last token (the
  /// prompt's last token is evaluated for its logits). `reused` is set to that prefix's length. The session is
  /// busy until release().
  size_t acquire(int model, std::span<const model::Token> tokens, int* reused);
  /// Another busy session holding the same tokens as `slot` (n choices of one prompt).
  size_t acquire_copy(size_t slot);
  model::Session& session(size_t slot) { return *slots_[slot].session; }
  /// The request is done with the session; it stays cached. `keep_for`: do not drop it for room before then,
  /// unless nothing else can go (Anthropic cache_control ttl, choreo.retention).
  void release(size_t slot, std::chrono::seconds keep_for = std::chrono::seconds(0));
  /// Drops idle sessions, least recently used first, until `bytes` more fit in the pool's budget or none is
  /// left to drop. False when the room could not be made this way (the pool may still evict messages).
  bool make_room(size_t bytes);
  /// Pages a session needs to hold `n_tokens` tokens beyond what it holds.
  size_t bytes_to_grow(size_t slot, int n_tokens) const;

  size_t sessions() const { return slots_.size(); }
  size_t busy() const;
  const SessionCacheStats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    std::unique_ptr<model::Session> session;
    int model = 0;
    bool busy = false;
    uint64_t last_use = 0;
    Clock::time_point keep_until{};
  };
  /// A free session of `model`: an idle one other than `avoid` (least recently used), else a new one.
  size_t take_free(int model, std::optional<size_t> avoid);
  bool drop_one(bool ignore_keep);

  const runtime::ModelSet& models_;
  kv::PagePool& pool_;
  std::vector<Slot> slots_;
  uint64_t tick_ = 0;
  SessionCacheStats stats_;
};

}  // namespace choreo::serve
