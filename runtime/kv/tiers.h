#pragma once
// KV tiers below the page pool (DESIGN.md §3, docs/store.md "Tiers"): T0 is the page pool attention reads
// (kv::PagePool, with its own budget); T1 is host memory holding copies of pages evicted from T0, within a
// budget of its own; T2 is the persistent store on disk (runtime/store), written for messages T1 has no room
// for when the engine has a T2 budget; below them, an encoding that is in no tier is recomputed from its
// parents. Which message
// leaves T0 first is the eviction policy's choice: `lru`, or `workflow` (KVFlow: the message whose next read
// is the most steps away goes first).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.h"

namespace choreo::kv {

using MessageId = uint32_t;

enum class EvictionPolicy {
  Lru,       // least recently used first (what every peer ships)
  Workflow,  // KVFlow: most steps to execution first; unshared suffixes before shared prefixes; then LRU
};
std::string_view policy_name(EvictionPolicy p);
/// Parses "lru" or "workflow"; throws InputError otherwise.
EvictionPolicy parse_eviction_policy(std::string_view name);

/// What one engine's tiers may hold and how they choose.
struct TierSettings {
  size_t host_bytes = 0;  // T1 budget; 0: no host tier (evicted pages are recomputed when needed again)
  EvictionPolicy policy = EvictionPolicy::Lru;
  // T2, the engine's persistent store: bytes this engine may write there for messages leaving T0 that T1
  // has no room for. 0: T2 is read (entries found there are loaded back) but never written by eviction.
  size_t disk_bytes = 0;
  // Prefetch (with the `workflow` policy only: it needs steps to execution): before each batch, messages
  // out of T0 that a running workflow reads within this many steps are brought back from T1 or T2 in the
  // background, into room made by evicting only messages needed later. 0: no prefetch.
  size_t prefetch_steps = 0;
  // Write-through (HiCache's option): every prefill and finished decode is written to T2 when it is made,
  // within disk_bytes, so eviction later has nothing to write. false: write-back (on eviction only).
  bool write_through = false;
};

/// What the tiers did with one store tier (T2: the persistent store on disk; T3: a shared Redis server).
struct StoreTierStats {
  uint64_t writes = 0;          // messages written (T2: on their way out of T0, or as made; T3: as made)
  uint64_t write_bytes = 0;     // their pages and E caches (the T2 budget, TierSettings::disk_bytes, counts these)
  uint64_t stored_bytes = 0;    // what the store holds for them (header included)
  uint64_t write_errors = 0;    // writes that failed (I/O); writes to the store stop after the first
  uint64_t hits = 0;            // messages loaded from it into T0
  uint64_t load_bytes = 0;
  uint64_t load_tokens = 0;
  uint64_t bad = 0;             // entries that failed a check (recomputed instead)
  uint64_t e_writes = 0;        // E caches written in their message's entry
  uint64_t e_write_bytes = 0;
  uint64_t e_loads = 0;         // E caches read back from an entry with their message's pages
  uint64_t e_load_bytes = 0;
};

/// What the tiers did during a run (Engine::tier_stats).
struct TierStats {
  uint64_t t0_evictions = 0;      // messages whose T0 pages were freed to make room
  uint64_t t1_offloads = 0;       // copies written T0 -> T1
  uint64_t t1_offload_bytes = 0;
  uint64_t t1_hits = 0;           // messages loaded back T1 -> T0
  uint64_t t1_load_bytes = 0;
  uint64_t t1_load_tokens = 0;
  uint64_t t1_evictions = 0;      // T1 copies dropped to make room in T1
  StoreTierStats t2;              // the persistent store
  StoreTierStats t3;              // Redis
  uint64_t prefetches = 0;        // messages whose load into T0 started ahead of the call reading them
  uint64_t prefetch_bytes = 0;
  uint64_t prefetch_used = 0;     // of those, read by a call
  uint64_t prefetch_wasted = 0;   // of those, evicted again before any call read them
  uint64_t prefetch_bad = 0;      // prefetches that found a bad entry (the call recomputed instead)
  double prefetch_wait_ms = 0;    // time calls waited for prefetches still in flight
  uint64_t recomputes = 0;        // messages recomputed because no tier held them
  uint64_t recomputed_tokens = 0;
  // E caches (the hidden states `partial` cross-model plans start from, DESIGN.md §6), charged to the tier
  // of their message's fastest copy of KV (T0 or T1); written to T2 and T3 in their message's entries (see
  // StoreTierStats).
  uint64_t e_saved = 0;           // E caches charged to T0 as their messages were encoded
  uint64_t e_saved_bytes = 0;
  uint64_t e_t1_offloads = 0;     // moved to T1 with their message's pages
  uint64_t e_t1_offload_bytes = 0;
  uint64_t e_t1_loads = 0;        // back to T0 with their message's pages
  uint64_t e_t1_load_bytes = 0;
  uint64_t e_dropped = 0;         // dropped: their tier had no room, or their message left T1 (or was released)
  uint64_t e_dropped_bytes = 0;   //   with no copy in a T2 or T3 entry
  uint64_t e_recomputed_tokens = 0;  // tokens whose E cache a plan needed and the sender recomputed
  double e_recompute_ms = 0;
  size_t t0_peak_bytes = 0;
  size_t t1_peak_bytes = 0;
  double load_ms = 0;             // time spent loading and recomputing evicted messages

  /// The counters of store tier `tier` (2 or 3).
  StoreTierStats& store(int tier) { return tier == 2 ? t2 : t3; }
  const StoreTierStats& store(int tier) const { return tier == 2 ? t2 : t3; }
};

/// One move of a message's KV between tiers, or its recomputation, as `--trace` shows it
/// (Engine::tier_events). Times are milliseconds on the steady clock the run's messages use.
struct TierEvent {
  enum class Kind {
    Offload,    // to `tier` on eviction (1: T0's pages copied to T1; 2: written to T2 as it left T0 or T1)
    Write,      // written to `tier` as it was made (2: write-through; 3: Redis)
    Load,       // `tier` -> T0, by the call that needed it
    Prefetch,   // `tier` -> T0 in the background, from the start of the load until it settled
    Recompute,  // encoded again over its parents (no tier held it)
  };
  Kind kind = Kind::Load;
  int tier = 0;
  MessageId message = 0;
  uint64_t bytes = 0;
  size_t tokens = 0;
  double start_ms = 0;
  double end_ms = 0;
};
/// The name of the trace track an event belongs to, e.g. "evict to T1", "T2->T0 prefetch", "recompute".
std::string track_name(const TierEvent& e);

/// The T1 budget's accounting; HostCopy charges it.
class HostTier {
 public:
  explicit HostTier(size_t budget_bytes = 0) : budget_(budget_bytes) {}
  size_t budget_bytes() const { return budget_; }
  void set_budget(size_t bytes) { budget_ = bytes; }
  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes() const { return peak_; }
  bool fits(size_t bytes) const { return in_use_ + bytes <= budget_; }
  /// Charges bytes held beside the page copies (E caches); false, charging nothing, when they do not fit.
  bool charge(size_t bytes);
  void uncharge(size_t bytes) { in_use_ -= std::min(bytes, in_use_); }

 private:
  friend class HostCopy;
  size_t budget_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

/// A message's pages copied to host memory (T1), charged to a HostTier while it lives. The memory is the
/// backend's host memory for asynchronous copies (Backend::alloc_host: pinned under CUDA), so the pages move
/// between T0 and T1 without the driver staging them.
class HostCopy {
 public:
  HostCopy() = default;
  /// `n_pages` pages of `page_bytes` bytes each, in `backend`'s host memory (the backend must outlive it).
  HostCopy(HostTier& tier, kernels::Backend& backend, size_t n_pages, size_t page_bytes);
  ~HostCopy() { reset(); }
  HostCopy(HostCopy&& other) noexcept { *this = std::move(other); }
  HostCopy& operator=(HostCopy&& other) noexcept;
  HostCopy(const HostCopy&) = delete;
  HostCopy& operator=(const HostCopy&) = delete;

  bool empty() const { return !data_; }
  size_t n_pages() const { return n_pages_; }
  size_t bytes() const { return n_pages_ * page_bytes_; }
  std::byte* page(size_t i) { return data_ + i * page_bytes_; }
  const std::byte* page(size_t i) const { return data_ + i * page_bytes_; }
  void reset();

 private:
  HostTier* tier_ = nullptr;
  kernels::Backend* backend_ = nullptr;
  std::byte* data_ = nullptr;  // backend_->alloc_host memory
  size_t n_pages_ = 0;
  size_t page_bytes_ = 0;
};

/// Retention hints a running workflow gives for a message (its `pin`, `priority`, `ttl`, `release`).
struct Retention {
  bool pin = false;              // stays in T0 while the workflow runs
  int priority = 0;              // lower leaves first
  std::optional<double> ttl_ms;  // unused this long, it leaves first
  bool release = false;          // once the workflow will not read it again, it leaves first
};

/// Two hints for one message (two plan nodes it is, or two instances that read it) as one: pinned if either
/// pins it, the higher priority, a time-to-live only when both give one (the longer), released only when both
/// say so.
Retention merged(const Retention& a, const Retention& b);

/// What the eviction policy knows of a message that could leave a tier.
struct EvictionCandidate {
  MessageId id = 0;
  std::optional<size_t> steps;  // steps until a running workflow reads it next; nullopt: never again
  bool shared = false;          // other messages were encoded over it (a shared prefix)
  bool released = false;        // its owner released it, or a hint says it may go now (expired, released)
  uint64_t last_use = 0;
  int priority = 0;             // the workflow's `priority:` hint
};

/// Sorts `candidates` so that the first is evicted first. Released records (and messages whose `ttl`
/// expired or whose `release` hint applies) always go first; then the lower `priority`; then `lru` orders by
/// last use, and `workflow` by steps to execution (never-again first, then the most steps), unshared before
/// shared, then last use.
void order_for_eviction(std::vector<EvictionCandidate>& candidates, EvictionPolicy policy);

}  // namespace choreo::kv
