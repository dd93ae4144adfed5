// Prefetch for the KV tiers (docs/store.md "Tiers", KVFlow): before each batch, messages out of T0 that a
// running workflow will read within TierSettings::prefetch_steps steps are brought back in the background,
// from T1 (one batched asynchronous copy of the backend), T2 (a thread that reads the mapped entry, checks every page's
// checksum and copies it in) or T3 (a thread that reads the value on a Redis connection of its own and checks
// it as a store entry). Room is made only by evicting messages needed later than the one
// prefetched. A message being prefetched holds its T0 pages (in use, marked `loading`) until it settles:
// when a call needs it (the call waits for what is left), when its load has finished by the next batch, or
// when the page pool needs room. A load that fails (a bad page) leaves the message out of T0 again, and the
// call that needs it reads it synchronously or recomputes it, as without prefetch.

#include <algorithm>
#include <chrono>
#include <future>

#include "common/clock.h"
#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/loading.h"
#include "runtime/store/disk_store.h"
#include "runtime/store/redis_store.h"

namespace choreo::runtime {

namespace {

/// Prefetches in flight at once (bounded concurrency: each may be a thread reading a file).
constexpr size_t kMaxPrefetches = 2;

/// Checks every page and E cache of an entry's bytes against its checksum, then copies the pages into
/// `pages` and the E caches at `e_layers` into `e_cache` (T2 and T3 prefetch jobs); what was wrong, or
/// nullopt.
std::optional<std::string> copy_entry_pages(std::span<const uint8_t> bytes, const store::ParsedEntry& parsed,
                                            const std::vector<kernels::PageId>& pages, kernels::Backend& backend,
                                            std::span<const int> e_layers, std::map<int, std::vector<float>>& e_cache) {
  if (parsed.meta.n_pages() != pages.size()) return "another page count";
  if (std::optional<std::string> bad = store::body_damage(bytes, parsed)) return bad;
  const kernels::Completion copy =
      backend.copy_pages_from_host(store::entry_page(bytes, parsed, 0), pages, {0, parsed.meta.page_bytes()});
  e_cache = store::e_sections(bytes, parsed, e_layers);
  copy.wait();
  return std::nullopt;
}

}  // namespace

bool Engine::parent_loading(const std::vector<Parent>& parents, int model) const {
  const auto in_flight = [&](kv::MessageId message) {
    for (const auto& [id, loading] : loading_)
      if (id == message && !loading->finished()) return true;
    return false;
  };
  for (const Parent& p : parents) {
    if (in_flight(p.message)) return true;
    // Another model's message is read through the call's model's encoding of it, which may be loading.
    const auto copy = encodings_on_.find({p.message, model});
    if (copy != encodings_on_.end() && in_flight(copy->second)) return true;
  }
  return false;
}

bool Engine::loading(const PrefillRequest& request) const { return parent_loading(request.parents, request.model); }
bool Engine::loading(const DecodeRequest& request) const { return parent_loading(request.parents, request.model); }

void Engine::prefetch_due() {
  settle_finished();
  if (tiers_.prefetch_steps == 0 || tiers_.policy != kv::EvictionPolicy::Workflow || step_oracles_.size() == 0)
    return;
  if (loading_.size() >= kMaxPrefetches) return;
  std::vector<std::pair<size_t, kv::MessageId>> due;  // (steps, message), soonest first
  for (kv::MessageId id = 0; id < store_.n_records(); ++id) {
    const kv::Message* m = store_.record_or_null(id);
    if (!m || m->resident() || !m->complete() || m->released || m->key == 0) continue;
    if (m->host.empty() && !(disk_ && m->on_disk) && !(remote_ && remote_->usable() && m->in_t3)) continue;
    const std::optional<size_t> steps = step_oracles_.steps_to_execution(read_as(*m));
    if (steps && *steps <= tiers_.prefetch_steps) due.push_back({*steps, id});
  }
  std::sort(due.begin(), due.end());
  for (const auto& [steps, id] : due) {
    if (loading_.size() >= kMaxPrefetches) break;
    start_prefetch(store_.record(id), steps);
  }
}

bool Engine::make_room_for(size_t n_pages, size_t steps) {
  kv::PagePool& pool = store_.pool();
  const size_t need = n_pages * pool.page_bytes();
  if (need > pool.budget_bytes()) return false;
  while (pool.budget_bytes() - pool.bytes_in_use() < need) {
    const std::vector<kv::EvictionCandidate> candidates = eviction_order(nullptr);
    // KVFlow: only what is needed later than the prefetched message (or never) may make room for it.
    if (candidates.empty() || (!candidates.front().released && candidates.front().steps &&
                               *candidates.front().steps <= steps))
      return false;
    offload(store_.record(candidates.front().id));
  }
  return true;
}

bool Engine::start_prefetch(kv::Message& m, size_t steps) {
  const double start = steady_ms();
  kv::PagePool& pool = store_.pool();
  const size_t n_pages = pool.layout().pages_for(m.tokens.size());
  if (!make_room_for(n_pages, steps)) return false;
  auto loading = std::make_unique<Loading>();
  const store::Compatibility expect{models_[size_t(m.model)].fingerprint, pool.layout()};
  if (!m.host.empty()) {
    loading->tier = 1;
    loading->host = std::move(m.host);
  } else if (disk_ && m.on_disk) {
    // T2: the entry is opened here (its header checked); its pages are read by the job.
    std::optional<store::MappedEntry> entry = disk_->open(m.key, expect);
    if (!entry || entry->meta().tokens != m.tokens || entry->meta().start_pos != m.start_pos) return false;
    loading->tier = 2;
    loading->entry = std::move(entry);
  } else {
    loading->tier = 3;  // T3: the job reads the value on a connection of its own
  }
  try {
    m.pages.reserve(int(m.tokens.size()));
    kernels::Backend& backend = pool.backend();
    if (loading->tier == 1) {
      loading->copy = backend.copy_pages_from_host(loading->host.page(0), std::span(m.pages.pages()).first(n_pages),
                                                   {0, pool.page_bytes()});
    } else if (loading->tier == 2) {
      const store::MappedEntry* entry = &*loading->entry;
      loading->job = std::async(std::launch::async, [entry, pages = m.pages.pages(), &backend,
                                                     e_layers = m.e_layers, e_cache = &loading->e_cache]() {
        return copy_entry_pages(entry->file.bytes(), entry->parsed, pages, backend, e_layers, *e_cache);
      });
    } else {
      loading->job = std::async(std::launch::async, [address = remote_->address(), key = m.key, expect,
                                                     tokens = m.tokens, start_pos = m.start_pos,
                                                     pages = m.pages.pages(), &backend, e_layers = m.e_layers,
                                                     e_cache = &loading->e_cache]() -> std::optional<std::string> {
        std::optional<std::vector<uint8_t>> bytes;
        try {
          store::RedisStore connection(address);
          bytes = connection.get(key);
        } catch (const std::exception&) {
          return "";  // the server went away: a miss; the call reads (or recomputes) it itself
        }
        if (!bytes) return "";
        const store::ParsedEntry parsed = store::parse_entry_for(*bytes, key, expect);
        if (parsed.problem != store::EntryProblem::Ok) return std::string(store::describe(parsed.problem));
        if (parsed.meta.tokens != tokens || parsed.meta.start_pos != start_pos) return "other tokens";
        return copy_entry_pages(*bytes, parsed, pages, backend, e_layers, *e_cache);
      });
    }
  } catch (...) {
    // No room after all, or no thread to read with: the message stays where it was. The T1 copy goes back
    // to it (a move keeps its buffer where the copy in flight reads it); the reset waits for it.
    if (loading->tier == 1) m.host = std::move(loading->host);
    loading.reset();
    m.pages.clear();
    return false;
  }
  loading->bytes = n_pages * pool.page_bytes();
  loading->start_ms = start;
  m.loading = true;
  ++m.in_use;
  ++tier_stats_.prefetches;
  tier_stats_.prefetch_bytes += loading->bytes;
  loading_.emplace_back(m.id, std::move(loading));
  return true;
}

bool Engine::settle(kv::Message& m, CallStats* stats) {
  auto it = std::find_if(loading_.begin(), loading_.end(), [&](const auto& l) { return l.first == m.id; });
  if (it == loading_.end()) return m.resident();
  std::unique_ptr<Loading> loading = std::move(it->second);
  loading_.erase(it);
  const double t0 = steady_ms();
  std::optional<std::string> bad;
  bool failed = false;
  try {
    if (loading->tier == 1) {
      loading->copy.wait();
    } else {
      bad = loading->job.get();
    }
  } catch (...) {
    failed = true;
  }
  const double waited = steady_ms() - t0;
  tier_stats_.prefetch_wait_ms += waited;
  tier_stats_.load_ms += waited;
  if (stats) stats->load_ms += waited;
  m.loading = false;
  --m.in_use;
  if (loading->tier == 1) m.host = std::move(loading->host);
  if (failed || bad) {
    // Not prefetched from there again; a call that needs it reads it itself, finds it bad (counted in
    // t2_bad / t3_bad then) and recomputes. A T3 miss is not bad: the server may have evicted it.
    if (bad && !bad->empty()) {
      if (loading->tier == 2)
        disk_->report_unusable(m.key, *bad);
      else
        remote_->report_bad(m.key, *bad);
      ++tier_stats_.prefetch_bad;
    }
    if (failed) ++tier_stats_.prefetch_bad;
    if (loading->tier >= 2) (loading->tier == 2 ? m.on_disk : m.in_t3) = false;
    m.pages.clear();
    return false;
  }
  if (loading->tier >= 2) take_e_cache(m, std::move(loading->e_cache), loading->tier);
  place_e_cache(m);
  if (loading->tier == 1) {
    ++tier_stats_.t1_hits;
    tier_stats_.t1_load_bytes += loading->bytes;
    tier_stats_.t1_load_tokens += m.tokens.size();
  } else if (loading->tier == 2) {
    disk_->touch(m.key);
    ++tier_stats_.t2_hits;
    tier_stats_.t2_load_bytes += loading->bytes;
    tier_stats_.t2_load_tokens += m.tokens.size();
  } else {
    ++tier_stats_.t3_hits;
    tier_stats_.t3_load_tokens += m.tokens.size();
  }
  record(kv::TierEvent::Kind::Prefetch, loading->tier, m, loading->bytes, loading->start_ms);
  m.prefetched = true;
  return true;
}

void Engine::settle_finished() {
  for (size_t i = 0; i < loading_.size();) {
    if (!loading_[i].second->finished()) {
      ++i;
      continue;
    }
    settle(store_.record(loading_[i].first), nullptr);  // removes entry i
  }
}

bool Engine::settle_one() {
  if (loading_.empty()) return false;
  settle(store_.record(loading_.front().first), nullptr);
  return true;
}

}  // namespace choreo::runtime
