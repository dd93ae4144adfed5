#pragma once
// The global cache of encoded messages (DESIGN.md §3): each message owns KV pages holding its tokens' keys
// and values, encoded once at a start position while attending to its parents. Identical encodings share one
// entry through a content key.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/token.h"
#include "runtime/kv/page_pool.h"
#include "runtime/kv/tiers.h"

namespace choreo::kv {

using MessageId = uint32_t;
inline constexpr MessageId kNoMessage = 0xFFFFFFFFu;

/// A parent as a message was encoded: which message, and at which logical offset it was placed.
struct PlacedParent {
  MessageId message = kNoMessage;
  int offset = 0;
  int n_tokens = -1;  // tokens of the parent that were visible (-1: all of them); not part of content keys
};

/// Where a message's E cache is charged (Engine::place_e_cache): T0 (the page pool's budget) while the
/// message's pages are there, T1 (the host tier's) while only its T1 copy is, or nowhere. Uncharges itself.
class TierCharge {
 public:
  TierCharge() = default;
  ~TierCharge() { reset(); }
  TierCharge(TierCharge&& other) noexcept { *this = std::move(other); }
  TierCharge& operator=(TierCharge&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = std::exchange(other.pool_, nullptr);
      host_ = std::exchange(other.host_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  TierCharge(const TierCharge&) = delete;
  TierCharge& operator=(const TierCharge&) = delete;

  /// Charges `bytes` to T0 (asking it to make room); false, charging nothing, when it cannot.
  bool to_t0(PagePool& pool, size_t bytes) {
    reset();
    return pool.charge(bytes) && set(&pool, nullptr, bytes);
  }
  /// Charges `bytes` to T1; false, charging nothing, when they do not fit.
  bool to_t1(HostTier& host, size_t bytes) {
    reset();
    return host.charge(bytes) && set(nullptr, &host, bytes);
  }
  /// 0 (T0), 1 (T1), or -1 (not charged).
  int tier() const { return pool_ ? 0 : host_ ? 1 : -1; }
  size_t bytes() const { return bytes_; }
  void reset() {
    if (pool_) pool_->uncharge(bytes_);
    if (host_) host_->uncharge(bytes_);
    pool_ = nullptr;
    host_ = nullptr;
    bytes_ = 0;
  }

 private:
  bool set(PagePool* pool, HostTier* host, size_t bytes) {
    pool_ = pool;
    host_ = host;
    bytes_ = bytes;
    return true;
  }
  PagePool* pool_ = nullptr;
  HostTier* host_ = nullptr;
  size_t bytes_ = 0;
};

/// Who may see a message (the information-flow check reads this).
enum class Visibility { Public, Private };

/// One encoded message.
struct Message {
  MessageId id = kNoMessage;
  uint64_t key = 0;                   // content key (0 for messages that are still growing)
  int model = 0;                      // the engine's model that encoded it (runtime/engine/model_set.h)
  MessageId source = kNoMessage;      // what it re-encodes for its model: another model's message, or none
  uint64_t variant = 0;               // the cross-model plan it was made with (0: its model's own encoding)
  // The repair policy (RepairPolicy::tag, common/repair_policy.h) its encoding applied to the parents it read
  // out of their exact prefix position; 0 when it read them as cached. Part of its content key; a message
  // with one is recomputed with it and, like a cross-model variant, never written to a store.
  uint64_t repair = 0;
  // The E cache (DESIGN.md §6): by layer, each encoded token's hidden state at the input of that layer
  // (model dim floats per token), saved while encoding at `e_layers`: where the `partial` plans of the
  // models that will read this message start; empty otherwise. It is charged to the tier of the message's
  // fastest copy of KV (T0 or T1), and dropped from memory when that tier has no room or the message leaves
  // T1. The message's T2 and T3 entries carry it, and loading the pages from one brings it back; a plan that
  // needs an E cache that is nowhere has the sender recompute it.
  std::map<int, std::vector<float>> e_cache;
  std::vector<int> e_layers;
  TierCharge e_charge;
  bool e_stored = false;              // a T2 or T3 entry of this message holds its E cache
  std::vector<Token> tokens;   // everything encoded, in order (a decode: header + generated)
  int start_pos = 0;                  // logical position of tokens[0] when encoded
  std::vector<PlacedParent> parents;  // what its encoding attended to (BOS excluded)
  std::string agent;
  Visibility visibility = Visibility::Public;
  PageList pages;
  int n_encoded = 0;                  // tokens whose K/V are in `pages` (== tokens.size() when complete)
  int pins = 0;                       // > 0: must not be evicted
  int in_use = 0;                     // > 0: a call running now reads or writes its pages (not evictable)
  int n_children = 0;                 // published messages encoded over this one (shared prefixes have some)
  bool released = false;              // released by its owner: kept only as a recipe to recompute children
  // Bit i: store i of the engine's tier manager holds its entry (this engine wrote it there or read it
  // from there), so a prefetch may read it from there (runtime/engine/tiers.h).
  uint32_t in_stores = 0;
  bool loading = false;               // a prefetch is filling its T0 pages: not readable until it settles
  bool prefetched = false;            // brought to T0 by a prefetch, and not read by a call since
  int prefetched_from = 0;            // the tier that prefetch read (1: T1, 2: T2, 3: T3)
  uint64_t last_use = 0;
  double last_use_ms = 0;             // steady_ms() of the last use (a `ttl` hint counts from it)
  /// The T1 (host memory) copy of the pages, or empty (runtime/kv/tiers.h).
  HostCopy host;

  explicit Message(PagePool& pool) : pages(pool) {}
  int end_pos() const { return start_pos + int(tokens.size()); }
  /// Every token is encoded (its encoding may live in any tier).
  bool complete() const { return n_encoded > 0 && n_encoded == int(tokens.size()); }
  /// Its pages are in T0, where attention reads them.
  bool resident() const { return !pages.pages().empty(); }
  /// Bytes of its E caches in memory.
  size_t e_cache_bytes() const {
    size_t bytes = 0;
    for (const auto& [layer, rows] : e_cache) bytes += rows.size() * sizeof(float);
    return bytes;
  }
};

/// Holds every message of an engine's models; finds identical encodings by content key.
class MessageStore {
 public:
  /// One fingerprint per model (Message::model indexes them): what its KV depends on.
  MessageStore(PagePool& pool, const std::vector<uint64_t>& model_fingerprints);
  MessageStore(PagePool& pool, uint64_t model_fingerprint)
      : MessageStore(pool, std::vector<uint64_t>{model_fingerprint}) {}

  /// Content key of an encoding: model, tokens, start position, and each parent's key with its offset.
  /// `variant` (nonzero) marks an encoding made another way than by the model alone (a cross-model plan);
  /// `repair` (nonzero) one made over parents repaired by that policy (Message::repair).
  uint64_t content_key(const std::vector<Token>& tokens, int start_pos,
                       const std::vector<PlacedParent>& parents, int model = 0, uint64_t variant = 0,
                       uint64_t repair = 0) const;

  /// A new, empty message (not yet findable by key).
  Message& create();
  /// Makes a complete message findable by its content key (computed here and stored in msg.key).
  void publish(Message& msg);
  /// The message with this content key, or null.
  Message* find(uint64_t key);

  Message& get(MessageId id);
  const Message& get(MessageId id) const;
  bool contains(MessageId id) const {
    return id < messages_.size() && messages_[id] != nullptr && !messages_[id]->released;
  }
  size_t size() const { return live_; }
  /// Frees a message's pages and host copy; its id becomes invalid to callers. Messages encoded on top of it
  /// keep their own KV. The record (tokens, parents) stays as a recipe, so that a child whose pages were
  /// evicted from every tier can still be recomputed (Message::released).
  void erase(MessageId id);

  /// Any message record, released ones included (for recomputation).
  Message& record(MessageId id);
  const Message& record(MessageId id) const;
  /// Number of records, released ones included: ids are below this.
  size_t n_records() const { return messages_.size(); }
  Message* record_or_null(MessageId id) { return id < messages_.size() ? messages_[id].get() : nullptr; }

  PagePool& pool() { return pool_; }
  const PagePool& pool() const { return pool_; }
  /// The seed of a model's content keys (its fingerprint, mixed with the KV cache types unless f32).
  uint64_t key_seed(int model = 0) const { return seeds_.at(size_t(model)); }
  uint64_t tick() { return ++clock_; }

 private:
  PagePool& pool_;
  std::vector<uint64_t> seeds_;  // per model
  std::vector<std::unique_ptr<Message>> messages_;
  std::unordered_map<uint64_t, MessageId> by_key_;
  size_t live_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace choreo::kv
