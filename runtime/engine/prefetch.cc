// Prefetch for the KV tiers (docs/store.md "Tiers", KVFlow): before each batch, messages out of T0 that a
// running workflow will read within TierSettings::prefetch_steps steps are brought back in the background,
// from T1 (the backend's asynchronous copies) or from T2 (a thread that reads the mapped entry, checks every
// page's checksum and copies it in). Room is made only by evicting messages needed later than the one
// prefetched. A message being prefetched holds its T0 pages (in use, marked `loading`) until it settles:
// when a call needs it (the call waits for what is left), when its load has finished by the next batch, or
// when the page pool needs room. A load that fails (a bad page) leaves the message out of T0 again, and the
// call that needs it reads it synchronously or recomputes it, as without prefetch.

#include <algorithm>
#include <chrono>
#include <future>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/loading.h"
#include "runtime/store/disk_store.h"

namespace choreo::runtime {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Prefetches in flight at once (bounded concurrency: each may be a thread reading a file).
constexpr size_t kMaxPrefetches = 2;

}  // namespace

bool Engine::parent_loading(const std::vector<Parent>& parents) const {
  for (const Parent& p : parents)
    for (const auto& [id, loading] : loading_)
      if (id == p.message && !loading->finished()) return true;
  return false;
}

bool Engine::loading(const PrefillRequest& request) const { return parent_loading(request.parents); }
bool Engine::loading(const DecodeRequest& request) const { return parent_loading(request.parents); }

void Engine::prefetch_due() {
  settle_finished();
  if (tiers_.prefetch_steps == 0 || tiers_.policy != kv::EvictionPolicy::Workflow || step_oracles_.size() == 0)
    return;
  if (loading_.size() >= kMaxPrefetches) return;
  std::vector<std::pair<size_t, kv::MessageId>> due;  // (steps, message), soonest first
  for (kv::MessageId id = 0; id < store_.n_records(); ++id) {
    const kv::Message* m = store_.record_or_null(id);
    if (!m || m->resident() || !m->complete() || m->released || m->key == 0) continue;
    if (m->host.empty() && !(disk_ && m->on_disk)) continue;  // only T1 and T2 are prefetched
    const std::optional<size_t> steps = step_oracles_.steps_to_execution(id);
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
    std::vector<kv::EvictionCandidate> candidates;
    for (kv::MessageId id = 0; id < store_.n_records(); ++id) {
      kv::Message* m = store_.record_or_null(id);
      if (!m || !m->resident() || !m->complete() || m->in_use > 0 || m->pins > 0 || id == bos_) continue;
      if (std::optional<kv::EvictionCandidate> c = candidate(id, *m)) candidates.push_back(*c);
    }
    kv::order_for_eviction(candidates, tiers_.policy);
    // KVFlow: only what is needed later than the prefetched message (or never) may make room for it.
    if (candidates.empty() || (!candidates.front().released && candidates.front().steps &&
                               *candidates.front().steps <= steps))
      return false;
    offload(store_.record(candidates.front().id));
  }
  return true;
}

bool Engine::start_prefetch(kv::Message& m, size_t steps) {
  kv::PagePool& pool = store_.pool();
  const size_t n_pages = pool.layout().pages_for(m.tokens.size());
  if (!make_room_for(n_pages, steps)) return false;
  auto loading = std::make_unique<Loading>();
  if (m.host.empty()) {
    // T2: the entry is opened here (its header checked); its pages are read by the job.
    const store::Compatibility expect{model_.fingerprint(), pool.layout()};
    std::optional<store::MappedEntry> entry = disk_->open(m.key, expect);
    if (!entry || entry->meta().tokens != m.tokens || entry->meta().start_pos != m.start_pos) return false;
    loading->tier = 2;
    loading->entry = std::move(entry);
  } else {
    loading->tier = 1;
    loading->host = std::move(m.host);
  }
  try {
    m.pages.reserve(int(m.tokens.size()));
    const size_t page_bytes = pool.page_bytes();
    kernels::Backend& backend = pool.backend();
    if (loading->tier == 1) {
      for (size_t p = 0; p < n_pages; ++p)
        loading->copies.push_back(backend.copy_from_host(loading->host.page(p), m.pages.pages()[p], {0, page_bytes}));
    } else {
      const store::MappedEntry* entry = &*loading->entry;
      loading->job = std::async(std::launch::async, [entry, pages = m.pages.pages(), &backend, page_bytes]() {
        const std::span<const uint8_t> bytes = entry->file.bytes();
        for (size_t i = 0; i < pages.size(); ++i) {
          if (!store::page_intact(bytes, entry->parsed, i)) return std::optional<size_t>(i);
          const uint8_t* src = bytes.data() + entry->parsed.pages_offset + i * page_bytes;
          backend.copy_from_host(src, pages[i], {0, page_bytes}).wait();
        }
        return std::optional<size_t>();
      });
    }
  } catch (...) {
    // No room after all, or no thread to read with: the message stays where it was.
    if (loading->tier == 1) {
      for (const kernels::Completion& c : loading->copies) try {
          c.wait();
        } catch (...) {
        }
      m.host = std::move(loading->host);
    }
    loading.reset();
    m.pages.clear();
    return false;
  }
  loading->bytes = n_pages * pool.page_bytes();
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
  const double t0 = now_ms();
  std::optional<size_t> bad;
  bool failed = false;
  try {
    if (loading->tier == 1) {
      for (const kernels::Completion& c : loading->copies) c.wait();
    } else {
      bad = loading->job.get();
    }
  } catch (...) {
    failed = true;
  }
  const double waited = now_ms() - t0;
  tier_stats_.prefetch_wait_ms += waited;
  tier_stats_.load_ms += waited;
  if (stats) stats->load_ms += waited;
  m.loading = false;
  --m.in_use;
  if (loading->tier == 1) m.host = std::move(loading->host);
  if (failed || bad) {
    if (bad) {
      // Not prefetched again; a call that needs it reads it itself, finds the bad page (counted in t2_bad
      // then) and recomputes.
      disk_->report_unusable(m.key, fmt::format("{} (page {})", store::describe(store::EntryProblem::PageChecksum), *bad));
      m.on_disk = false;
    }
    ++tier_stats_.prefetch_bad;
    m.pages.clear();
    return false;
  }
  if (loading->tier == 1) {
    ++tier_stats_.t1_hits;
    tier_stats_.t1_load_bytes += loading->bytes;
    tier_stats_.t1_load_tokens += m.tokens.size();
  } else {
    disk_->touch(m.key);
    ++tier_stats_.t2_hits;
    tier_stats_.t2_load_bytes += loading->bytes;
    tier_stats_.t2_load_tokens += m.tokens.size();
  }
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
