#pragma once
// The KV tier manager (DESIGN.md §3, docs/store.md "Tiers"): where each message's pages live, and every move
// between tiers. T0 is the page pool attention reads; T1 host memory (kv::HostTier); below them an ordered
// list of stores behind one interface (store::EntryStore: the disk store as T2, Redis as T3); below those,
// recomputation, which the engine does for it (TierManager::Recompute). The engine asks it to hold a call's
// parents in T0 and tells it what it made; the page pool asks it, not the engine, for room.
//
// It lives in runtime/engine rather than runtime/kv: it reads and writes entries through store/, which sits
// above kv/ in the layering, and it reads the running workflows' step oracles (KVFlow) to order eviction and
// prefetch.
//
// One load path serves the call that needs a message now and the prefetch that brings it back ahead of its
// call: begin_load reserves the pages and starts the copy (T1) or the read (a store: run on a thread of its
// own for a prefetch, or when waited for), finish_load waits for it, checks it and applies it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/model_set.h"
#include "runtime/engine/placement.h"
#include "runtime/engine/requests.h"
#include "runtime/engine/step_oracle.h"
#include "runtime/kv/message_store.h"
#include "runtime/kv/tiers.h"
#include "runtime/store/entry_store.h"

namespace choreo::runtime {

/// Messages a call is using: resident in T0 and not evictable until it ends.
class Held {
 public:
  explicit Held(kv::MessageStore& store) : store_(store) {}
  ~Held() {
    for (kv::MessageId id : ids_) --store_.record(id).in_use;
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  void add(kv::Message& m) {
    ++m.in_use;
    ids_.push_back(m.id);
  }

 private:
  kv::MessageStore& store_;
  std::vector<kv::MessageId> ids_;
};

/// What the tier manager does with one store (TierManager::add_store).
struct StoreUse {
  // Messages leaving T0 that T1 cannot keep are written here (write-back, within TierSettings::disk_bytes);
  // with TierSettings::write_through, every message as soon as it is made.
  bool evictions = false;
  // Every prefill computed here (and every message a cross-model plan recomputes whole) is written here as it
  // is made: encodings shared with other processes.
  bool prefills = false;
  // TierManager::persist writes here (`choreo encode`, and prefills with `persist_prefills`).
  bool persist = false;
  bool persist_prefills = false;  // every computed prefill is persisted, with its ancestors
};

/// Residency of one engine's messages across T0-T3.
class TierManager {
 public:
  /// Encodes a message again over its parents (the engine's work), holding them with hold_parents; called
  /// when no tier holds a message a call needs.
  using Recompute = std::function<void(kv::Message&, CallStats*)>;

  /// Over `messages` (whose pages come from `pool`) of `models`, positions below `n_ctx`. Only binds the
  /// references: the engine constructs it before its message store, so that host copies outlive messages.
  TierManager(kv::PagePool& pool, kv::MessageStore& messages, const ModelSet& models, int n_ctx,
              Recompute recompute);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;
  /// Starts answering the pool's requests for room (the engine calls it once its message store exists).
  void start();
  /// Waits for every load in flight and stops answering the pool (before the messages go).
  void stop();

  // ---- settings ----
  /// The T1 budget, the eviction policy, the T2 budget, prefetch and write-through (kv::TierSettings).
  void set_settings(const kv::TierSettings& settings);
  const kv::TierSettings& settings() const { return settings_; }
  /// Adds a store (not owned) below T1. Stores are kept fastest first (by tier); a message found in none of
  /// the stores before it is looked for in the next.
  void add_store(store::EntryStore& store, StoreUse use);
  bool has_stores() const { return !stores_.empty(); }
  /// The implicit BOS messages (one per model): always resident, never written to a store.
  void set_bos(std::vector<kv::MessageId> bos) { bos_ = std::move(bos); }
  /// How soon each cached message is read next (KVFlow): eviction and prefetch read it.
  StepOracleRegistry& step_oracles() { return step_oracles_; }

  // ---- what the tiers did ----
  kv::TierStats stats() const;
  const std::vector<kv::TierEvent>& events() const { return events_; }
  size_t host_bytes_in_use() const { return host_.bytes_in_use(); }
  /// Counts tokens whose E cache a cross-model plan needed and the sender recomputed.
  void count_e_recompute(uint64_t tokens, double ms);

  // ---- residency ----
  /// Brings message `id` to T0 if it is elsewhere (make_resident) and marks it in use until `held` ends.
  void hold(kv::MessageId id, Held& held, CallStats* stats);
  /// Holds each of m's recorded parents in T0 until `held` ends; returns them as views at their offsets.
  std::vector<PlacedView> hold_parents(const kv::Message& m, Held& held, CallStats* stats);
  /// Brings a complete message's pages to T0: waits for its prefetch, else loads them from T1 or the first
  /// store that has a usable entry, else has it recomputed. Loads and recomputations are counted in `stats`.
  void make_resident(kv::Message& m, CallStats* stats);
  /// A message was just made and published: its E cache is charged, and it is written where the stores'
  /// uses say (`prefill`: it was a prefill, or a cross-model encoding made whole).
  void made(kv::Message& m, bool prefill);
  /// Charges m's E cache to the tier of m's fastest copy of KV (T0, else T1), or drops it when that tier has
  /// no room or m is in neither; called whenever m is encoded or moves between tiers.
  void place_e_cache(kv::Message& m);

  // ---- prefetch (TierSettings::prefetch_steps) ----
  /// Starts loads for the messages a running workflow reads within prefetch_steps steps (and settles the
  /// ones that finished).
  void prefetch_due();
  /// True while a prefetch is filling the message's pages.
  bool loading(kv::MessageId id) const;
  /// Waits for m's prefetch, if one is in flight, and applies it.
  void settle(kv::Message& m, CallStats* stats);

  // ---- stores ----
  /// The message with this content key: in memory, else loaded from the first store holding a usable entry
  /// (its parents first, by key), else nullopt. `model`: whose entries to read.
  std::optional<kv::MessageId> load(uint64_t key, int model);
  /// Writes a complete message to the persist store, with its ancestors that are not there yet (parents
  /// first, each once); retried (3 attempts in all) when entries it wrote vanish meanwhile, then
  /// RuntimeFailure. `tag` is stored as-is. Throws InputError when no store persists, or for a message that
  /// cannot be persisted.
  void persist(kv::MessageId id, uint64_t tag);
  /// True when the persist store holds a usable entry of the message: header (and MAC when keyed) and every
  /// page and E cache checked. A damaged one is reported.
  bool persisted(kv::MessageId id);
  /// The tier (2 or 3) of the fastest store known to hold m's entry; 0 when none is.
  int store_tier(const kv::Message& m) const;
  /// Whether computed prefills are persisted as they are made (StoreUse::persist_prefills).
  bool persists_prefills() const;
  /// m's E caches at `layers` from its entry in a store (those it holds, each checked), or none: for a plan
  /// whose sender's E cache was dropped from memory but not from the store.
  std::map<int, std::vector<float>> stored_e_cache(const kv::Message& m, std::span<const int> layers);

 private:
  struct Store {
    store::EntryStore* store = nullptr;
    StoreUse use;
    uint32_t bit = 0;  // its bit in kv::Message::in_stores
    bool writable = true;  // false after a write failed with an I/O error
  };
  struct Load;
  struct HeldPages;
  using Source = size_t;  // kT1, or an index into stores_
  static constexpr Source kT1 = ~size_t(0);

  // -- the load path (tier_loads.cc) --
  std::unique_ptr<Load> begin_load(kv::Message& m, Source from, bool background);
  bool finish_load(kv::Message& m, Load& load, CallStats* stats);
  bool start_prefetch(kv::Message& m, size_t steps);
  bool make_room_for(size_t n_pages, size_t steps);
  bool settle_one();
  void settle_finished();
  // -- eviction (tiers.cc) --
  std::optional<kv::EvictionCandidate> candidate(kv::MessageId id, const kv::Message& m) const;
  std::vector<kv::EvictionCandidate> eviction_order(HeldPages* held);
  bool evict_one();
  void offload(kv::Message& m);
  bool make_host_room(size_t bytes, kv::MessageId keep);
  bool host_room(size_t bytes, kv::MessageId keep) {
    return bytes <= host_.budget_bytes() && (host_.fits(bytes) || make_host_room(bytes, keep));
  }
  void recompute(kv::Message& m, CallStats* stats);
  void record(kv::TierEvent::Kind kind, int tier, const kv::Message& m, uint64_t bytes, double start_ms);
  // -- writes (tier_stores.cc) --
  Store* eviction_store();  // the first store taking evictions, or null
  Store* persist_store();   // the first store taking persist(), or null
  bool may_write_back(const kv::Message& m, size_t bytes);
  void write_back(kv::Message& m, std::vector<const std::byte*> pages, kv::TierEvent::Kind kind);
  void write_resident(kv::Message& m, kv::TierEvent::Kind kind);
  // Writes m's entry to `s` (pages: where they are; empty: its T0 pages, brought back first if need be).
  // False when the store could not take it; RuntimeFailure on an I/O error.
  bool save_entry(Store& s, kv::MessageId id, uint64_t tag, std::vector<const std::byte*> pages);
  store::EntryMeta entry_meta(const kv::Message& m, uint64_t tag) const;
  store::Compatibility compatibility(int model) const;
  std::vector<kv::MessageId> unstored_ancestry(kv::MessageId id);
  std::optional<kv::MessageId> load_stored(uint64_t key, int depth, int model);
  // Takes E caches read from an entry of store tier `tier` into m (when m holds none and they are its model's).
  void take_e_cache(kv::Message& m, std::map<int, std::vector<float>> e_cache, int tier);
  bool accept_e_cache(const kv::Message& m, std::map<int, std::vector<float>>& e_cache, int tier);
  bool is_bos(kv::MessageId id) const;
  static kv::MessageId read_as(const kv::Message& m) { return m.source != kv::kNoMessage ? m.source : m.id; }

  kv::PagePool& pool_;
  kv::MessageStore& messages_;
  const ModelSet& models_;
  int n_ctx_;
  Recompute recompute_;
  kv::HostTier host_;
  kv::TierSettings settings_;
  kv::TierStats stats_;
  std::vector<kv::TierEvent> events_;
  StepOracleRegistry step_oracles_;
  std::vector<Store> stores_;  // fastest first
  std::vector<kv::MessageId> bos_;
  // Prefetches in flight, in the order they started. Their background reads write message pages: stop()
  // waits for them before the messages go.
  std::vector<std::pair<kv::MessageId, std::unique_ptr<Load>>> loading_;
};

}  // namespace choreo::runtime
