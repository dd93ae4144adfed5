// The tier manager's load path (runtime/engine/tiers.h) and prefetch (docs/store.md "Tiers", KVFlow).
//
// A load brings one message's pages back to T0 from T1 (one batched asynchronous copy of the backend) or from a
// store (a job that finishes the store's open, checks every page's checksum and copies them in). A call that
// needs the message now waits for its load at once; a prefetch starts the same load before each batch for the
// messages a running workflow reads within TierSettings::prefetch_steps steps, its job on a thread of its own,
// and room for it is made only by evicting messages needed later. A message being prefetched holds its T0
// pages (in use, marked `loading`) until it settles: when a call needs it (the call waits for what is left),
// when its load has finished by the next batch, or when the page pool needs room. A load that fails (a bad
// page) leaves the message out of T0 again, and the call that needs it reads it itself or recomputes it.

#include <algorithm>
#include <exception>

#include "common/clock.h"
#include "common/error.h"
#include "runtime/engine/tier_load.h"

namespace choreo::runtime {

namespace {
/// Prefetches in flight at once (bounded concurrency: each may be a thread reading a file or a server).
constexpr size_t kMaxPrefetches = 2;
}  // namespace

std::unique_ptr<TierManager::Load> TierManager::begin_load(kv::Message& m, Source from, bool background) {
  auto load = std::make_unique<Load>();
  load->from = from;
  load->background = background;
  load->start_ms = steady_ms();
  const size_t n_pages = pool_.layout().pages_for(m.tokens.size());
  load->bytes = n_pages * pool_.page_bytes();
  std::unique_ptr<store::PendingEntry> pending;
  if (from != kT1) {
    // Any usable entry with the message's content key: written by this engine, or by another run, process or
    // `choreo encode`. Keys cover the model, tokens, positions and parents; the tokens are checked too.
    store::EntryStore& s = *stores_[from].store;
    load->tier = s.tier();
    if (m.key == 0) return nullptr;
    const store::Compatibility expect = compatibility(m.model);
    if (background) {
      pending = s.begin_open(m.key, expect, nullptr);
    } else {
      store::Opened opened = s.open(m.key, expect);
      if (opened.bad) ++stats_.store(load->tier).bad;
      if (opened.entry &&
          (opened.entry->meta().tokens != m.tokens || opened.entry->meta().start_pos != m.start_pos))
        opened.entry.reset();
      if (opened.entry) pending = std::make_unique<store::ReadyEntry>(std::move(opened));
    }
    if (!pending) return nullptr;
  } else {
    load->host = std::move(m.host);
  }
  // Allocating the pages may evict other messages (to T1: the copy read here is held aside meanwhile); the
  // message's own first pages must not make it a candidate.
  try {
    Held loading(messages_);
    loading.add(m);
    m.pages.reserve(int(m.tokens.size()));
  } catch (...) {
    m.pages.clear();
    if (from == kT1) m.host = std::move(load->host);
    throw;
  }
  kernels::Backend& backend = pool_.backend();
  const std::vector<kernels::PageId> pages(m.pages.pages().begin(), m.pages.pages().begin() + ptrdiff_t(n_pages));
  try {
    if (from == kT1) {
      load->copy = backend.copy_pages_from_host(load->host.page(0), pages, {0, pool_.page_bytes()});
    } else {
      auto job = [pending = std::move(pending), pages, &backend, e_layers = m.e_layers, tokens = m.tokens,
                  start_pos = m.start_pos, e_cache = &load->e_cache,
                  has_e = &load->entry_has_e]() -> std::optional<std::string> {
        std::string problem;
        const store::Opened opened = pending->finish(problem);
        if (!opened.entry) return opened.bad ? problem : std::string();
        const store::EntryMeta& meta = opened.entry->meta();
        if (meta.tokens != tokens || meta.start_pos != start_pos) return "other tokens";
        *has_e = !meta.e_layers.empty();
        return store::read_entry(*opened.entry, pages, backend, e_layers, *e_cache);
      };
      load->job = std::async(background ? std::launch::async : std::launch::deferred, std::move(job));
    }
  } catch (...) {
    // No thread to read with: the message stays where it was (a T1 copy goes back to it).
    m.pages.clear();
    if (from == kT1) m.host = std::move(load->host);
    if (!background) throw;
    return nullptr;
  }
  return load;
}

bool TierManager::finish_load(kv::Message& m, Load& load, CallStats* stats) {
  const double t0 = steady_ms();
  std::optional<std::string> bad;
  std::exception_ptr failed;
  try {
    if (load.from == kT1)
      load.copy.wait();
    else
      bad = load.job.get();
  } catch (...) {
    failed = std::current_exception();
  }
  if (load.background) {
    const double waited = steady_ms() - t0;
    stats_.prefetch_wait_ms += waited;
    stats_.load_ms += waited;
    if (stats) stats->load_ms += waited;
    m.loading = false;
    --m.in_use;
  }
  if (load.from == kT1) m.host = std::move(load.host);
  if (failed || bad) {
    // A damaged entry is reported and not read from that store again; the message is read from elsewhere or
    // recomputed. A prefetch that found nothing is no fault: a server may have evicted the value.
    const bool damaged = bad && !bad->empty();
    if (load.from != kT1) {
      Store& s = stores_[load.from];
      if (damaged) s.store->report_bad(m.key, *bad);
      if (damaged && !load.background) ++stats_.store(load.tier).bad;
      m.in_stores &= ~s.bit;
    }
    if (load.background && (damaged || failed)) ++stats_.prefetch_bad;
    m.pages.clear();
    if (failed && !load.background) std::rethrow_exception(failed);
    return false;
  }
  const size_t n_tokens = m.tokens.size();
  if (load.from == kT1) {
    ++stats_.t1_hits;
    stats_.t1_load_bytes += load.bytes;
    stats_.t1_load_tokens += n_tokens;
  } else {
    Store& s = stores_[load.from];
    if (load.entry_has_e) m.e_stored = true;
    take_e_cache(m, std::move(load.e_cache), load.tier);
    s.store->touch(m.key);
    m.in_stores |= s.bit;
    kv::StoreTierStats& counters = stats_.store(load.tier);
    ++counters.hits;
    counters.load_bytes += load.bytes;
    counters.load_tokens += n_tokens;
  }
  place_e_cache(m);
  record(load.background ? kv::TierEvent::Kind::Prefetch : kv::TierEvent::Kind::Load, load.tier, m, load.bytes,
         load.start_ms);
  if (load.background) {
    m.prefetched = true;
    m.prefetched_from = load.tier;
  } else if (stats) {
    stats->n_loaded += int(n_tokens);
    stats->n_loaded_from[size_t(load.tier)] += int(n_tokens);
  }
  return true;
}

// ---- prefetch ----------------------------------------------------------------------------------------

bool TierManager::loading(kv::MessageId id) const {
  for (const auto& [message, load] : loading_)
    if (message == id && !load->finished()) return true;
  return false;
}

void TierManager::prefetch_due() {
  settle_finished();
  if (settings_.prefetch_steps == 0 || settings_.policy != kv::EvictionPolicy::Workflow ||
      step_oracles_.size() == 0)
    return;
  if (loading_.size() >= kMaxPrefetches) return;
  const auto readable = [&](const kv::Message& m) {
    if (!m.host.empty()) return true;
    for (const Store& s : stores_)
      if ((m.in_stores & s.bit) && s.store->usable()) return true;
    return false;
  };
  std::vector<std::pair<size_t, kv::MessageId>> due;  // (steps, message), soonest first
  for (kv::MessageId id = 0; id < messages_.n_records(); ++id) {
    const kv::Message* m = messages_.record_or_null(id);
    if (!m || m->resident() || !m->complete() || m->released || m->key == 0 || !readable(*m)) continue;
    const std::optional<size_t> steps = step_oracles_.steps_to_execution(read_as(*m));
    if (steps && *steps <= settings_.prefetch_steps) due.push_back({*steps, id});
  }
  std::sort(due.begin(), due.end());
  for (const auto& [steps, id] : due) {
    if (loading_.size() >= kMaxPrefetches) break;
    start_prefetch(messages_.record(id), steps);
  }
}

bool TierManager::make_room_for(size_t n_pages, size_t steps) {
  const size_t need = n_pages * pool_.page_bytes();
  if (need > pool_.budget_bytes()) return false;
  while (pool_.budget_bytes() - pool_.bytes_in_use() < need) {
    const std::vector<kv::EvictionCandidate> candidates = eviction_order(nullptr);
    // KVFlow: only what is needed later than the prefetched message (or never) may make room for it.
    if (candidates.empty() || (!candidates.front().released && candidates.front().steps &&
                               *candidates.front().steps <= steps))
      return false;
    offload(messages_.record(candidates.front().id));
  }
  return true;
}

bool TierManager::start_prefetch(kv::Message& m, size_t steps) {
  if (!make_room_for(pool_.layout().pages_for(m.tokens.size()), steps)) return false;
  Source from = kT1;
  if (m.host.empty()) {
    const auto s = std::find_if(stores_.begin(), stores_.end(),
                                [&](const Store& s) { return (m.in_stores & s.bit) && s.store->usable(); });
    if (s == stores_.end()) return false;
    from = Source(s - stores_.begin());
  }
  std::unique_ptr<Load> load;
  try {
    load = begin_load(m, from, /*background=*/true);
  } catch (...) {
    return false;  // no room after all: the message stays where it was
  }
  if (!load) return false;
  m.loading = true;
  ++m.in_use;
  ++stats_.prefetches;
  stats_.prefetch_bytes += load->bytes;
  loading_.emplace_back(m.id, std::move(load));
  return true;
}

void TierManager::settle(kv::Message& m, CallStats* stats) {
  auto it = std::find_if(loading_.begin(), loading_.end(), [&](const auto& l) { return l.first == m.id; });
  if (it == loading_.end()) return;
  std::unique_ptr<Load> load = std::move(it->second);
  loading_.erase(it);
  finish_load(m, *load, stats);
}

void TierManager::settle_finished() {
  for (size_t i = 0; i < loading_.size();) {
    if (!loading_[i].second->finished()) {
      ++i;
      continue;
    }
    settle(messages_.record(loading_[i].first), nullptr);  // removes entry i
  }
}

bool TierManager::settle_one() {
  if (loading_.empty()) return false;
  settle(messages_.record(loading_.front().first), nullptr);
  return true;
}

}  // namespace choreo::runtime
