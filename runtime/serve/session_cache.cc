#include "runtime/serve/session_cache.h"

#include <algorithm>
#include <stdexcept>

namespace choreo::serve {

namespace {

/// Sessions kept at most (idle ones beyond it are reused, least recently used first); memory is bounded by
/// the pool's budget in any case.
constexpr size_t kMaxSessions = 1024;

int common_prefix(const std::vector<model::Token>& a, std::span<const model::Token> b, int limit) {
  int n = 0;
  const int end = std::min({int(a.size()), int(b.size()), limit});
  while (n < end && a[size_t(n)] == b[size_t(n)]) ++n;
  return n;
}

}  // namespace

size_t SessionCache::busy() const {
  return size_t(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; }));
}

size_t SessionCache::take_free(int model, std::optional<size_t> avoid) {
  std::optional<size_t> empty, lru;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.busy || s.model != model || (avoid && *avoid == i)) continue;
    if (s.session->n_past() == 0 && !empty) empty = i;
    if (!lru || s.last_use < slots_[*lru].last_use) lru = i;
  }
  size_t slot;
  if (empty) {
    slot = *empty;
  } else if (slots_.size() < kMaxSessions || !lru) {
    const runtime::EngineModel& m = models_[size_t(model)];
    Slot s;
    s.session = std::make_unique<model::Session>(*m.weights, pool_);
    s.session->set_lora(m.lora.empty() ? nullptr : &m.lora);
    s.model = model;
    slots_.push_back(std::move(s));
    slot = slots_.size() - 1;
  } else {
    slot = *lru;
  }
  slots_[slot].busy = true;
  slots_[slot].last_use = ++tick_;
  return slot;
}

size_t SessionCache::acquire(int model, std::span<const model::Token> tokens, int* reused) {
  if (model < 0 || size_t(model) >= models_.size()) throw std::out_of_range("SessionCache: no such model");
  ++stats_.acquired;
  const int limit = std::max(0, int(tokens.size()) - 1);
  std::optional<size_t> best;
  int best_len = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.model != model) continue;
    const int n = common_prefix(s.session->tokens(), tokens, limit);
    // Longest first; on ties an idle session, then one with nothing beyond the prefix, then the newest.
    const bool better = !best || n > best_len ||
                        (n == best_len && std::make_tuple(!s.busy, s.session->n_past() == n, s.last_use) >
                                              std::make_tuple(!slots_[*best].busy,
                                                              slots_[*best].session->n_past() == best_len,
                                                              slots_[*best].last_use));
    if (better) best = i, best_len = n;
  }
  *reused = best_len;
  if (best && best_len > 0 && !slots_[*best].busy && slots_[*best].session->n_past() == best_len) {
    Slot& s = slots_[*best];  // its tokens are all a prefix of the prompt: extend it in place
    s.busy = true;
    s.last_use = ++tick_;
    ++stats_.extended;
    return *best;
  }
  const size_t slot = take_free(model, best);
  model::Session& target = *slots_[slot].session;
  if (best && best_len > 0) {
    make_room(bytes_to_grow(slot, best_len - std::min(best_len, target.n_past())));
    target.copy_prefix_from(*slots_[*best].session, best_len);
    ++stats_.copied;
    stats_.copied_tokens += uint64_t(best_len);
  } else {
    target.truncate(0);
  }
  return slot;
}

size_t SessionCache::acquire_copy(size_t from) {
  const size_t slot = take_free(slots_[from].model, from);
  model::Session& source = *slots_[from].session;
  make_room(bytes_to_grow(slot, std::max(0, source.n_past() - slots_[slot].session->n_past())));
  slots_[slot].session->copy_prefix_from(source, source.n_past());
  ++stats_.copied;
  stats_.copied_tokens += uint64_t(source.n_past());
  return slot;
}

void SessionCache::release(size_t slot, std::chrono::seconds keep_for) {
  Slot& s = slots_.at(slot);
  s.busy = false;
  s.last_use = ++tick_;
  if (keep_for.count() > 0) s.keep_until = std::max(s.keep_until, Clock::now() + keep_for);
}

size_t SessionCache::bytes_to_grow(size_t slot, int n_tokens) const {
  const int page_tokens = pool_.layout().page_tokens;
  const model::Session& s = *slots_[slot].session;
  // Pages already held past n_past stay with the session (truncate keeps them): count from its page count.
  const int held_pages = int(s.pages_held());
  const int need_pages = (s.n_past() + std::max(0, n_tokens) + page_tokens - 1) / page_tokens;
  return size_t(std::max(0, need_pages - held_pages)) * pool_.page_bytes();
}

bool SessionCache::drop_one(bool ignore_keep) {
  const Clock::time_point now = Clock::now();
  std::optional<size_t> victim;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.busy || s.session->pages_held() == 0) continue;
    if (!ignore_keep && s.keep_until > now) continue;
    if (!victim || s.last_use < slots_[*victim].last_use) victim = i;
  }
  if (!victim) return false;
  slots_[*victim].session->reset();
  ++stats_.dropped;
  return true;
}

bool SessionCache::make_room(size_t bytes) {
  auto fits = [&] { return pool_.bytes_in_use() + bytes <= pool_.budget_bytes(); };
  while (!fits())
    if (!drop_one(false) && !drop_one(true)) return false;
  return true;
}

}  // namespace choreo::serve
