// The tier manager's residency and eviction (runtime/engine/tiers.h): holding messages in T0, choosing what
// leaves it, moving pages to T1 or a store, and charging E caches. The load path is in tier_loads.cc, the
// stores' reads and writes in tier_stores.cc.

#include "runtime/engine/tiers.h"

#include <algorithm>

#include "common/clock.h"
#include "common/error.h"
#include "runtime/engine/tier_load.h"

namespace choreo::runtime {

/// What stays in T0 when nothing more can leave, for the error of a pool that cannot fit a call.
struct TierManager::HeldPages {
  size_t pages = 0;
  std::vector<std::string> messages;  // the first few, described
};

TierManager::TierManager(kv::PagePool& pool, kv::MessageStore& messages, const ModelSet& models, int n_ctx,
                         Recompute recompute)
    : pool_(pool), messages_(messages), models_(models), n_ctx_(n_ctx), recompute_(std::move(recompute)) {}

TierManager::~TierManager() { stop(); }

void TierManager::start() {
  pool_.set_reclaimer([this] { return evict_one(); });
}

void TierManager::stop() {
  pool_.set_reclaimer(nullptr);
  loading_.clear();  // each load waits for its background work, while the pages it writes still exist
}

void TierManager::set_settings(const kv::TierSettings& settings) {
  settings_ = settings;
  host_.set_budget(settings.host_bytes);
  // A smaller T1 budget than what it holds now: drop copies until it fits.
  while (host_.bytes_in_use() > host_.budget_bytes() &&
         make_host_room(host_.bytes_in_use() - host_.budget_bytes(), kv::kNoMessage)) {
  }
}

void TierManager::add_store(store::EntryStore& store, StoreUse use) {
  if (stores_.size() >= 32) throw std::logic_error("TierManager: at most 32 stores");
  const auto at = std::upper_bound(stores_.begin(), stores_.end(), store.tier(),
                                   [](int tier, const Store& s) { return tier < s.store->tier(); });
  stores_.insert(at, Store{&store, use, 0, true});
  // A message's bits name stores by position: no message may carry bits yet when the order changes.
  for (size_t i = 0; i < stores_.size(); ++i) stores_[i].bit = uint32_t(1) << i;
}

kv::TierStats TierManager::stats() const {
  kv::TierStats s = stats_;
  s.t0_peak_bytes = pool_.peak_bytes();
  s.t1_peak_bytes = host_.peak_bytes();
  return s;
}

void TierManager::count_e_recompute(uint64_t tokens, double ms) {
  stats_.e_recomputed_tokens += tokens;
  stats_.e_recompute_ms += ms;
}

bool TierManager::is_bos(kv::MessageId id) const { return std::find(bos_.begin(), bos_.end(), id) != bos_.end(); }

// ---- residency ---------------------------------------------------------------------------------------

void TierManager::hold(kv::MessageId id, Held& held, CallStats* stats) {
  kv::Message& m = messages_.record(id);
  make_resident(m, stats);
  held.add(m);
}

std::vector<PlacedView> TierManager::hold_parents(const kv::Message& m, Held& held, CallStats* stats) {
  std::vector<PlacedView> views;
  for (const kv::PlacedParent& p : m.parents) {
    hold(p.message, held, stats);
    const kv::Message& pm = messages_.record(p.message);
    const int n = p.n_tokens >= 0 ? p.n_tokens : int(pm.tokens.size());
    views.push_back({p.message, p.offset, n, p.offset - pm.start_pos});
  }
  return views;
}

void TierManager::make_resident(kv::Message& m, CallStats* stats) {
  m.last_use = messages_.tick();
  m.last_use_ms = steady_ms();
  if (m.loading) settle(m, stats);  // a prefetch in flight: wait for what is left (a failed one: see below)
  if (m.prefetched && m.resident()) {
    m.prefetched = false;
    ++stats_.prefetch_used;
    if (stats) {
      stats->n_loaded += int(m.tokens.size());
      stats->n_loaded_from[size_t(m.prefetched_from)] += int(m.tokens.size());
    }
  }
  if (m.resident() || !m.complete()) return;  // in T0 already, or nothing encoded to bring back
  const double t0 = steady_ms();
  // T1, else the first store with a usable entry (a damaged one is not looked for further down: the message
  // is recomputed), else recomputation. Results never depend on where the pages came from.
  bool loaded = false;
  if (!m.host.empty()) {
    std::unique_ptr<Load> load = begin_load(m, kT1, /*background=*/false);
    loaded = load && finish_load(m, *load, stats);
  }
  for (size_t i = 0; !loaded && i < stores_.size(); ++i) {
    if (!stores_[i].store->usable()) continue;
    std::unique_ptr<Load> load = begin_load(m, i, /*background=*/false);
    if (!load) continue;
    loaded = finish_load(m, *load, stats);
    break;
  }
  if (!loaded) recompute(m, stats);
  const double dt = steady_ms() - t0;
  stats_.load_ms += dt;
  if (stats) stats->load_ms += dt;
}

void TierManager::recompute(kv::Message& m, CallStats* stats) {
  // The encoding is a function of the tokens, their positions and the parents' encodings at their offsets;
  // the kernels are batch invariant, so encoding it again alone gives the bits it had.
  const double start = steady_ms();
  const int n_tokens = m.n_encoded;
  recompute_(m, stats);
  place_e_cache(m);
  record(kv::TierEvent::Kind::Recompute, 0, m, 0, start);
  ++stats_.recomputes;
  stats_.recomputed_tokens += uint64_t(n_tokens);
  if (stats) stats->n_recomputed += n_tokens;
}

void TierManager::place_e_cache(kv::Message& m) {
  if (m.e_cache.empty()) {
    m.e_charge.reset();
    return;
  }
  const int want = m.resident() ? 0 : !m.host.empty() ? 1 : -1;
  const int had = m.e_charge.tier();
  if (want == had) return;
  const size_t bytes = m.e_cache_bytes();
  // On the CPU backend both tiers are host memory: the rows stay where they are, and only the budget they
  // are charged to changes.
  m.e_charge.reset();
  bool placed = false;
  if (want == 0) {
    Held held(messages_);  // the room made for it must not be m's own pages
    held.add(m);
    placed = m.e_charge.to_t0(pool_, bytes);
  } else if (want == 1) {
    placed = host_room(bytes, m.id) && m.e_charge.to_t1(host_, bytes);
  }
  if (!placed) {
    m.e_cache.clear();
    if (!m.e_stored) {  // otherwise a store's entry still has it
      ++stats_.e_dropped;
      stats_.e_dropped_bytes += bytes;
    }
  } else if (want == 1) {
    ++stats_.e_t1_offloads;
    stats_.e_t1_offload_bytes += bytes;
  } else if (had == 1) {
    ++stats_.e_t1_loads;
    stats_.e_t1_load_bytes += bytes;
  } else {
    ++stats_.e_saved;
    stats_.e_saved_bytes += bytes;
  }
}

void TierManager::record(kv::TierEvent::Kind kind, int tier, const kv::Message& m, uint64_t bytes,
                         double start_ms) {
  constexpr size_t kMaxEvents = size_t(1) << 20;
  if (events_.size() >= kMaxEvents) return;
  events_.push_back({kind, tier, m.id, bytes, m.tokens.size(), start_ms, steady_ms()});
}

// ---- eviction ----------------------------------------------------------------------------------------

std::optional<kv::EvictionCandidate> TierManager::candidate(kv::MessageId id, const kv::Message& m) const {
  kv::EvictionCandidate c{id, std::nullopt, m.n_children > 0, m.released, m.last_use, 0};
  if (m.released) return c;
  // The running workflows' hints (`pin`, `priority`, `ttl`, `release`) and steps to execution. Another
  // model's encoding of a message is read when that message is, and kept as it is.
  const kv::MessageId as = read_as(m);
  const std::optional<kv::Retention> hint = step_oracles_.size() ? step_oracles_.retention(as) : std::nullopt;
  if (hint && hint->pin) return std::nullopt;
  if (settings_.policy == kv::EvictionPolicy::Workflow || (hint && hint->release))
    c.steps = step_oracles_.steps_to_execution(as);
  if (hint) {
    c.priority = hint->priority;
    if (hint->ttl_ms && steady_ms() - m.last_use_ms > *hint->ttl_ms) c.released = true;  // expired
    if (hint->release && !c.steps) c.released = true;  // its workflow will not read it again
  }
  return c;
}

std::vector<kv::EvictionCandidate> TierManager::eviction_order(HeldPages* held) {
  std::vector<kv::EvictionCandidate> candidates;
  for (kv::MessageId id = 0; id < messages_.n_records(); ++id) {
    kv::Message* m = messages_.record_or_null(id);
    if (!m || !m->resident()) continue;
    std::optional<kv::EvictionCandidate> c;
    const bool movable = m->complete() && m->in_use == 0 && m->pins == 0 && !is_bos(id);
    if (movable) c = candidate(id, *m);
    if (c) {
      candidates.push_back(*c);
    } else if (held) {
      held->pages += m->pages.pages().size();
      if (held->messages.size() < 6 && !is_bos(id))
        held->messages.push_back(fmt::format("message {}{} ({} tokens{})", id,
                                             m->agent.empty() ? "" : fmt::format(" of agent '{}'", m->agent),
                                             m->tokens.size(), movable || m->pins > 0 ? ", pinned" : ""));
    }
  }
  kv::order_for_eviction(candidates, settings_.policy);
  return candidates;
}

bool TierManager::evict_one() {
  HeldPages held;
  const std::vector<kv::EvictionCandidate> candidates = eviction_order(&held);
  if (candidates.empty() && settle_one()) return true;  // a prefetch held pages: settled, it can go now
  if (candidates.empty()) {
    throw InputError(
        fmt::format("KV cache budget (T0) of {:.1f} MiB cannot hold what the running calls need: {} pages of "
                    "{:.2f} MiB are in use or pinned{}{}",
                    pool_.budget_bytes() / 1048576.0, held.pages, pool_.page_bytes() / 1048576.0,
                    held.messages.empty() ? "" : ", by ", fmt::join(held.messages, ", ")),
        "raise the cache budget (--cache-mib), pin fewer messages, or give the calls fewer or shorter parents");
  }
  offload(messages_.record(candidates.front().id));
  return true;
}

void TierManager::offload(kv::Message& m) {
  const size_t n_pages = pool_.layout().pages_for(m.tokens.size());
  const size_t bytes = n_pages * pool_.page_bytes();
  if (m.host.empty() && !m.released && host_room(bytes, m.id)) {
    const double start = steady_ms();
    m.host = kv::HostCopy(host_, pool_.backend(), n_pages, pool_.page_bytes());
    m.pages.download(n_pages, m.host.page(0));
    record(kv::TierEvent::Kind::Offload, 1, m, bytes, start);
    ++stats_.t1_offloads;
    stats_.t1_offload_bytes += bytes;
  } else if (m.host.empty()) {
    write_resident(m, kv::TierEvent::Kind::Offload);
  }
  m.pages.clear();
  place_e_cache(m);
  ++stats_.t0_evictions;
  if (m.prefetched) {
    m.prefetched = false;
    ++stats_.prefetch_wasted;
  }
}

bool TierManager::make_host_room(size_t bytes, kv::MessageId keep) {
  // Copies of messages still in T0 go first (dropping them loses nothing now), each group in policy order.
  std::vector<kv::EvictionCandidate> resident, evicted;
  for (kv::MessageId id = 0; id < messages_.n_records(); ++id) {
    kv::Message* m = messages_.record_or_null(id);
    if (!m || m->host.empty() || id == keep) continue;
    const std::optional<kv::EvictionCandidate> c = candidate(id, *m);
    if (!c && !m->resident()) continue;  // pinned: its only copy stays
    (m->resident() ? resident : evicted).push_back(c.value_or(kv::EvictionCandidate{id}));
  }
  kv::order_for_eviction(resident, settings_.policy);
  kv::order_for_eviction(evicted, settings_.policy);
  resident.insert(resident.end(), evicted.begin(), evicted.end());
  const size_t target = host_.budget_bytes() >= bytes ? host_.budget_bytes() - bytes : 0;
  for (const kv::EvictionCandidate& c : resident) {
    if (host_.bytes_in_use() <= target) break;
    kv::Message& m = messages_.record(c.id);
    if (!m.resident()) {  // its last copy: down to the eviction store when it takes it
      std::vector<const std::byte*> pages;
      for (size_t p = 0; p < m.host.n_pages(); ++p) pages.push_back(m.host.page(p));
      write_back(m, pages, kv::TierEvent::Kind::Offload);
    }
    m.host.reset();
    place_e_cache(m);
    ++stats_.t1_evictions;
  }
  return host_.bytes_in_use() <= target;
}

}  // namespace choreo::runtime
