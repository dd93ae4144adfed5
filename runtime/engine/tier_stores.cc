// The tier manager's writes and reads of whole entries (runtime/engine/tiers.h, docs/store.md): write-back
// of messages leaving T0 and T1, write-through as messages are made, persist (a message with the ancestors
// its entry names), and loading a message by content key alone, its parents first.

#include <algorithm>
#include <filesystem>
#include <unordered_set>

#include "common/clock.h"
#include "common/error.h"
#include "common/repair_policy.h"
#include "runtime/engine/tiers.h"

namespace choreo::runtime {

namespace {

/// The E-cache sections of an entry of m (described by meta, made by entry_meta), in meta's layer order.
std::vector<std::span<const uint8_t>> e_section_spans(const kv::Message& m, const store::EntryMeta& meta) {
  std::vector<std::span<const uint8_t>> out;
  for (uint32_t layer : meta.e_layers) {
    const std::vector<float>& rows = m.e_cache.at(int(layer));
    out.push_back({reinterpret_cast<const uint8_t*>(rows.data()), rows.size() * sizeof(float)});
  }
  return out;
}

/// The first n_pages of m's T0 pages in host memory, and a pointer to each.
struct StagedPages {
  std::vector<std::byte> host;
  std::vector<const std::byte*> pages;
  StagedPages(const kv::Message& m, size_t n_pages, size_t page_bytes) : host(m.pages.to_host(n_pages)) {
    for (size_t p = 0; p < n_pages; ++p) pages.push_back(host.data() + p * page_bytes);
  }
};
}  // namespace

TierManager::Store* TierManager::eviction_store() {
  for (Store& s : stores_)
    if (s.use.evictions) return &s;
  return nullptr;
}

TierManager::Store* TierManager::persist_store() {
  for (Store& s : stores_)
    if (s.use.persist) return &s;
  return nullptr;
}

bool TierManager::persists_prefills() const {
  return std::any_of(stores_.begin(), stores_.end(), [](const Store& s) { return s.use.persist_prefills; });
}

store::Compatibility TierManager::compatibility(int model) const {
  return {models_[size_t(model)].fingerprint, pool_.layout()};
}

// ---- writes ------------------------------------------------------------------------------------------

void TierManager::made(kv::Message& m, bool prefill) {
  place_e_cache(m);
  // A cross-model plan's encoding (variant) is not written: its key is not a hash of what the entry holds;
  // nor is one made over repaired parents (an entry does not carry the policy its recomputation would need).
  if (m.variant != 0 || m.repair != 0) return;
  if (prefill && m.key != 0 && m.resident()) {
    // Shared with other processes as soon as it exists (T3).
    for (Store& s : stores_) {
      if (!s.use.prefills || !s.writable || !s.store->usable()) continue;
      const double start = steady_ms();
      const size_t n_pages = pool_.layout().pages_for(m.tokens.size());
      const StagedPages staged(m, n_pages, pool_.page_bytes());
      const size_t payload = n_pages * pool_.page_bytes() + m.e_cache_bytes();
      try {
        if (save_entry(s, m.id, 0, staged.pages)) {
          kv::StoreTierStats& counters = stats_.store(s.store->tier());
          ++counters.writes;
          counters.write_bytes += payload;
          record(kv::TierEvent::Kind::Write, s.store->tier(), m, payload, start);
        }
      } catch (const RuntimeFailure&) {
        ++stats_.store(s.store->tier()).write_errors;
        s.writable = false;
      }
    }
  }
  // Write-through (HiCache's option): to the eviction store as soon as it is complete.
  if (settings_.write_through && m.complete() && m.resident()) write_resident(m, kv::TierEvent::Kind::Write);
}

bool TierManager::may_write_back(const kv::Message& m, size_t bytes) {
  const Store* s = eviction_store();
  return s && s->writable && s->store->usable() && !m.released && !(m.in_stores & s->bit) && m.key != 0 &&
         m.variant == 0 && m.repair == 0 &&
         stats_.store(s->store->tier()).write_bytes + bytes <= settings_.disk_bytes;
}

void TierManager::write_resident(kv::Message& m, kv::TierEvent::Kind kind) {
  const size_t n_pages = pool_.layout().pages_for(m.tokens.size());
  if (!may_write_back(m, n_pages * pool_.page_bytes())) return;  // before staging the pages for nothing
  const StagedPages staged(m, n_pages, pool_.page_bytes());
  write_back(m, staged.pages, kind);
}

void TierManager::write_back(kv::Message& m, std::vector<const std::byte*> pages, kv::TierEvent::Kind kind) {
  // The message's own entry (its ancestors stay in memory, as records at least). An entry the store cannot
  // take (its name held by a directory) leaves the message to be recomputed; a write that fails (a full disk)
  // stops writes to that store for this engine.
  const size_t bytes = pages.size() * pool_.page_bytes() + m.e_cache_bytes();
  if (!may_write_back(m, bytes)) return;
  Store& s = *eviction_store();
  kv::StoreTierStats& counters = stats_.store(s.store->tier());
  const double start = steady_ms();
  try {
    if (save_entry(s, m.id, 0, std::move(pages))) {
      record(kind, s.store->tier(), m, bytes, start);
      ++counters.writes;
      counters.write_bytes += bytes;
    }
  } catch (const RuntimeFailure&) {
    ++counters.write_errors;
    s.writable = false;
  }
}

store::EntryMeta TierManager::entry_meta(const kv::Message& m, uint64_t tag) const {
  store::EntryMeta meta;
  for (const kv::PlacedParent& p : m.parents) meta.parents.push_back({messages_.record(p.message).key, p.offset});
  const EngineModel& model = models_[size_t(m.model)];
  meta.model_fingerprint = model.fingerprint;
  meta.content_key = m.key;
  meta.tag = tag;
  meta.model_name = std::filesystem::path(model.weights->file().path()).filename().string();
  meta.tokens = m.tokens;
  meta.start_pos = m.start_pos;
  meta.agent = m.agent;
  meta.visibility = uint32_t(m.visibility);
  meta.layout = pool_.layout();
  // The E caches it holds for every token (a plan's sender reads them back with the pages).
  const size_t dim = size_t(model.weights->config().dim);
  for (const auto& [layer, rows] : m.e_cache)
    if (rows.size() == m.tokens.size() * dim) meta.e_layers.push_back(uint32_t(layer));
  if (!meta.e_layers.empty()) meta.e_dim = uint32_t(dim);
  return meta;
}

bool TierManager::save_entry(Store& s, kv::MessageId id, uint64_t tag, std::vector<const std::byte*> pages) {
  Held held(messages_);
  if (pages.empty()) hold(id, held, nullptr);  // its T0 pages, brought back first if need be
  const kv::Message& m = messages_.get(id);
  const store::EntryMeta meta = entry_meta(m, tag);
  std::vector<std::byte> host;
  if (pages.empty()) {
    // A decode may hold a spare page beyond its last token: only the entry's pages are written.
    host = m.pages.to_host(meta.n_pages());
    for (size_t p = 0; p < meta.n_pages(); ++p) pages.push_back(host.data() + p * meta.page_bytes());
  }
  pages.resize(meta.n_pages());
  const std::optional<uint64_t> stored = s.store->save(meta, pages, e_section_spans(m, meta));
  if (!stored) return false;
  kv::Message& written = messages_.record(id);
  written.in_stores |= s.bit;
  kv::StoreTierStats& counters = stats_.store(s.store->tier());
  counters.stored_bytes += *stored;
  if (!meta.e_layers.empty()) {
    written.e_stored = true;
    ++counters.e_writes;
    counters.e_write_bytes += meta.e_layers.size() * meta.e_section_bytes();
  }
  return true;
}

// ---- persist -----------------------------------------------------------------------------------------

std::vector<kv::MessageId> TierManager::unstored_ancestry(kv::MessageId id) {
  // Depth-first, children after their parents (post-order), each message once however many paths reach it.
  // An ancestor the store holds a usable entry for ends the walk there: its own ancestors were stored with
  // it.
  store::EntryStore& s = *persist_store()->store;
  std::vector<kv::MessageId> order;
  std::unordered_set<kv::MessageId> seen{id};
  std::vector<std::pair<kv::MessageId, size_t>> stack{{id, 0}};  // (message, next parent to visit)
  while (!stack.empty()) {
    auto& [message, next] = stack.back();
    const kv::Message& m = messages_.get(message);
    if (next == m.parents.size()) {
      order.push_back(message);
      stack.pop_back();
      continue;
    }
    const kv::MessageId parent = m.parents[next++].message;
    if (!messages_.contains(parent))
      throw InputError(
          fmt::format("persist: message {} was encoded over message {}, which was released", message, parent),
          "persist a message before releasing its parents");
    if (is_bos(parent) || !seen.insert(parent).second) continue;
    const kv::Message& p = messages_.get(parent);
    if (!s.open(p.key, compatibility(p.model)).entry) stack.push_back({parent, 0});
  }
  return order;
}

void TierManager::persist(kv::MessageId id, uint64_t tag) {
  Store* s = persist_store();
  if (!s) throw InputError("persist: no persistent store is set", "give a cache directory");
  if (!messages_.contains(id)) throw InputError(fmt::format("persist: unknown message {}", id));
  const kv::Message& m = messages_.get(id);
  if (m.key == 0 || m.tokens.empty() || m.n_encoded != int(m.tokens.size()) || m.pages.pages().empty())
    throw InputError(fmt::format("persist: message {} has no complete encoding", id),
                     "only messages encoded in choreo mode can be persisted");
  if (is_bos(id)) return;  // every engine encodes its own BOS
  // The message itself is always written; an ancestor only when the store has no usable entry for it.
  std::vector<kv::MessageId> to_write = unstored_ancestry(id);  // parents first, ends with `id`
  for (kv::MessageId a : to_write)
    if (messages_.get(a).repair != 0)
      throw InputError(
          fmt::format("persist: message {} was encoded over repaired parents ({}), which a store "
                      "entry cannot say",
                      a, RepairPolicy::from_tag(messages_.get(a).repair).name()),
          "persist what was encoded without a repair policy (`repair: none`)");
  const size_t n_written = to_write.size();
  // Another process may delete entries meanwhile (`cache gc`, `cache rm`): whatever it took of what this call
  // wrote is written again, each message at most once per attempt, for a bounded number of attempts.
  constexpr int kMaxAttempts = 3;
  std::unordered_set<kv::MessageId> unwritable;  // a directory holds the entry's name (save reported it)
  for (int attempt = 1;; ++attempt) {
    for (kv::MessageId a : to_write)
      if (!save_entry(*s, a, tag, {})) unwritable.insert(a);
    std::erase_if(to_write, [&](kv::MessageId a) {
      return unwritable.contains(a) || s->store->holds(messages_.get(a).key);
    });
    if (to_write.empty()) return;
    if (attempt == kMaxAttempts)
      throw RuntimeFailure(fmt::format(
          "persist: the store {} keeps losing entries: {} of the {} entries written for message {} were gone "
          "again after {} attempts (is another process removing them, e.g. `choreo cache gc` or `rm`?)",
          s->store->where(), to_write.size(), n_written, id, kMaxAttempts));
  }
}

bool TierManager::persisted(kv::MessageId id) {
  Store* s = persist_store();
  const kv::Message& m = messages_.get(id);
  if (!s || m.key == 0) return false;
  const store::Opened opened = s->store->open(m.key, compatibility(m.model));
  if (!opened.entry) return false;
  if (const std::optional<std::string> bad = store::body_damage(opened.entry->bytes(), opened.entry->parsed())) {
    s->store->report_bad(m.key, *bad);
    return false;
  }
  return true;
}

// ---- loads by content key ----------------------------------------------------------------------------

int TierManager::store_tier(const kv::Message& m) const {
  for (const Store& s : stores_)
    if (m.in_stores & s.bit) return s.store->tier();
  return 0;
}

std::optional<kv::MessageId> TierManager::load(uint64_t key, int model) {
  if (kv::Message* m = messages_.find(key)) return m->id;  // keys cover the model: this is its encoding
  if (stores_.empty()) return std::nullopt;
  return load_stored(key, 0, model);
}

std::optional<kv::MessageId> TierManager::load_stored(uint64_t key, int depth, int model) {
  // Parents are loaded first (recursively). Parents that load are in memory for the next lookup, and a load
  // stops at its first parent that fails, so the work stays linear in the ancestry even where paths meet.
  if (kv::Message* m = messages_.find(key)) return m->id;
  Store* from = nullptr;
  store::Opened opened;
  for (Store& s : stores_) {
    if (!s.store->usable()) continue;
    opened = s.store->open(key, compatibility(model));
    if (opened.bad) ++stats_.store(s.store->tier()).bad;
    if (opened.entry) {
      from = &s;
      break;
    }
  }
  if (!from) return std::nullopt;
  kv::StoreTierStats& counters = stats_.store(from->store->tier());
  const auto reject = [&](std::string_view why) {
    ++counters.bad;
    from->store->report_bad(key, why);
    return std::nullopt;
  };
  // Keys hash their parents' keys, so real ancestries are acyclic; the bound stops a crafted cycle.
  constexpr int kMaxAncestry = 4096;
  if (depth > kMaxAncestry) return reject("ancestry deeper than 4096 messages");
  const store::EntryMeta& meta = opened.entry->meta();
  const int n_vocab = models_.base().weights->config().n_vocab;
  if (meta.start_pos + int64_t(meta.tokens.size()) > n_ctx_ ||
      std::any_of(meta.tokens.begin(), meta.tokens.end(), [&](Token t) { return t < 0 || t >= n_vocab; }))
    return reject("tokens or positions outside this model's range");
  std::vector<kv::PlacedParent> parents;
  for (const store::EntryParent& p : meta.parents) {
    std::optional<kv::MessageId> parent = load_stored(p.key, depth + 1, model);
    if (!parent || p.offset < 0 || p.offset > n_ctx_) return std::nullopt;
    parents.push_back({*parent, int(p.offset)});
  }
  if (messages_.content_key(meta.tokens, meta.start_pos, parents, model) != key)
    return reject("its tokens and parents do not hash to its content key");
  const double start = steady_ms();
  kv::Message& m = messages_.create();
  m.model = model;
  m.tokens = meta.tokens;
  m.start_pos = meta.start_pos;
  m.parents = std::move(parents);
  m.agent = meta.agent;
  m.visibility =
      meta.visibility == uint32_t(kv::Visibility::Private) ? kv::Visibility::Private : kv::Visibility::Public;
  // Its E caches stay in the entry (e_stored): a plan that needs them reads them from there.
  std::optional<std::string> damage;
  try {
    m.pages.reserve(int(m.tokens.size()));
    std::map<int, std::vector<float>> none;
    damage = store::read_entry(*opened.entry, m.pages.pages(), pool_.backend(), {}, none);
  } catch (...) {
    messages_.erase(m.id);
    throw;
  }
  if (damage) {
    messages_.erase(m.id);
    return reject(*damage);
  }
  if (!meta.e_layers.empty()) m.e_stored = true;
  m.n_encoded = int(m.tokens.size());
  m.in_stores |= from->bit;
  messages_.publish(m);
  const uint64_t bytes = meta.n_pages() * meta.page_bytes();
  record(kv::TierEvent::Kind::Load, from->store->tier(), m, bytes, start);
  from->store->touch(key);
  ++counters.hits;
  counters.load_bytes += bytes;
  counters.load_tokens += m.tokens.size();
  return m.id;
}

// ---- E caches in entries -----------------------------------------------------------------------------

bool TierManager::accept_e_cache(const kv::Message& m, std::map<int, std::vector<float>>& e_cache, int tier) {
  const size_t rows = m.tokens.size() * size_t(models_[size_t(m.model)].weights->config().dim);
  std::erase_if(e_cache, [&](const auto& layer) { return layer.second.size() != rows; });
  if (e_cache.empty()) return false;
  kv::StoreTierStats& counters = stats_.store(tier);
  ++counters.e_loads;
  for (const auto& [layer, rows] : e_cache) counters.e_load_bytes += rows.size() * sizeof(float);
  return true;
}

void TierManager::take_e_cache(kv::Message& m, std::map<int, std::vector<float>> e_cache, int tier) {
  if (!m.e_cache.empty() || !accept_e_cache(m, e_cache, tier)) return;
  m.e_cache = std::move(e_cache);
  m.e_stored = true;
}

std::map<int, std::vector<float>> TierManager::stored_e_cache(const kv::Message& m, std::span<const int> layers) {
  if (!m.e_stored || m.key == 0 || m.variant != 0) return {};
  for (Store& s : stores_) {
    if (!s.store->usable()) continue;
    store::Opened opened = s.store->open(m.key, compatibility(m.model));
    if (opened.bad) ++stats_.store(s.store->tier()).bad;
    if (!opened.entry) continue;
    const store::StoredEntry& entry = *opened.entry;
    if (entry.meta().tokens != m.tokens || entry.meta().start_pos != m.start_pos) return {};
    std::vector<int> found;
    for (size_t j = 0; j < entry.meta().e_layers.size(); ++j) {
      const int layer = int(entry.meta().e_layers[j]);
      if (std::find(layers.begin(), layers.end(), layer) == layers.end()) continue;
      if (!store::e_section_intact(entry.bytes(), entry.parsed(), j)) {
        ++stats_.store(s.store->tier()).bad;
        s.store->report_bad(m.key, fmt::format("{} (layer {})", store::describe(store::EntryProblem::ECacheChecksum),
                                               layer));
        return {};
      }
      found.push_back(layer);
    }
    std::map<int, std::vector<float>> out = store::e_sections(entry.bytes(), entry.parsed(), found);
    if (accept_e_cache(m, out, s.store->tier())) s.store->touch(m.key);
    return out;
  }
  return {};
}

}  // namespace choreo::runtime
