// Several models in one engine (runtime/engine/model_set.h): a call on model B that names a parent encoded
// by model A reads it as the plan for A -> B says (DESIGN.md §6):
// - `recompute` (the default): B's own encoding of the message, with its tokens, start position and placed
//   parents, each parent in B's encoding of it: exactly what B would have computed had it encoded the whole
//   ancestry itself;
// - `reuse`: A's message itself;
// - `partial [s, e)` (DroidSpeak): A's KV, with layers s..e-1 recomputed by B from A's hidden state at the
//   input of layer s (the E cache), attending to the parents read the same way; a plan with several ranges
//   recomputes each from the sender's hidden state at its first layer.
// Encodings made for B are cached under B's content key (with the plan's fingerprint for `partial`) like any
// other message, shared with every later call, and may come from the persistent store.

#include <map>
#include <unordered_set>

#include <xxhash.h>

#include "common/clock.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_work.h"

namespace choreo::runtime {

void Engine::set_plan(int sender, int receiver, CrossModelPlan plan) {
  models_.set_plan(sender, receiver, std::move(plan));
  std::vector<kv::MessageId> stale;
  for (auto it = encodings_on_.begin(); it != encodings_on_.end();) {
    const auto [source, model] = it->first;
    if (model == receiver && store_.record(source).model == sender) {
      if (it->second != source) stale.push_back(it->second);
      it = encodings_on_.erase(it);
    } else {
      ++it;
    }
  }
  for (kv::MessageId id : stale)
    if (store_.contains(id)) release(id);
}

std::vector<Parent> Engine::parents_on(int model, std::span<const Parent> parents, CallStats& stats) {
  std::vector<Parent> out(parents.begin(), parents.end());
  for (Parent& p : out) {
    // An unknown or incomplete parent is left for place() to report.
    if (!store_.contains(p.message)) continue;
    const kv::Message& m = store_.get(p.message);
    if (!same_model(m.model, model) && m.complete()) p.message = encoding_on(model, p.message, stats);
  }
  return out;
}

kv::MessageId Engine::encoding_on(int model, kv::MessageId id, CallStats& stats) {
  // `model`'s encoding of a message, when it exists already.
  const auto known = [&](kv::MessageId a) -> std::optional<kv::MessageId> {
    // Another model's encoding of a message `model` encoded itself (a call of that model read it earlier):
    // the original, which is what any plan approximates.
    if (const kv::MessageId source = store_.record(a).source; source != kv::kNoMessage && store_.contains(source) &&
        same_model(store_.record(source).model, model) && store_.get(source).complete())
      return source;
    const int sender = store_.record(a).model;
    if (same_model(sender, model) || models_.plan(sender, model).kind == CrossModelPlan::Kind::Reuse) return a;
    const auto it = encodings_on_.find({a, model});
    if (it != encodings_on_.end() && store_.contains(it->second)) return it->second;
    return std::nullopt;
  };
  // Depth first over the ancestry, parents before children (records of released ancestors included: they
  // are kept as recipes), each message once: keys are content hashes, so the ancestry is acyclic.
  std::vector<std::pair<kv::MessageId, size_t>> stack{{id, 0}};  // (message, next parent to visit)
  while (!stack.empty()) {
    const kv::MessageId a = stack.back().first;
    const size_t next = stack.back().second;
    if (next == 0 && known(a)) {
      stack.pop_back();
      continue;
    }
    const kv::Message& src = store_.record(a);
    if (next < src.parents.size()) {
      ++stack.back().second;
      const kv::MessageId parent = src.parents[next].message;
      if (!known(parent)) stack.push_back({parent, 0});
      continue;
    }
    stack.pop_back();
    std::vector<kv::PlacedParent> parents;
    for (const kv::PlacedParent& p : src.parents) parents.push_back({*known(p.message), p.offset, p.n_tokens});
    const CrossModelPlan& plan = models_.plan(src.model, model);
    uint64_t variant = 0;
    if (plan.kind == CrossModelPlan::Kind::Partial) {
      const uint64_t words[2] = {plan.fingerprint(), models_[size_t(src.model)].fingerprint};
      variant = XXH3_64bits(words, sizeof words);
    }
    // A message encoded over repaired parents is encoded again with the same repair policy (repair.cc).
    const uint64_t repair_tag = variant == 0 ? src.repair : 0;
    const uint64_t key = store_.content_key(src.tokens, src.start_pos, parents, model, variant, repair_tag);
    kv::MessageId out = kv::kNoMessage;
    if (kv::Message* found = store_.find(key)) {
      out = found->id;
    } else if (std::optional<kv::MessageId> loaded = variant == 0 && repair_tag == 0 && tiers_.has_stores()
                                                         ? tiers_.load(key, model)
                                                         : std::nullopt) {
      out = *loaded;
      stats.n_loaded += int(src.tokens.size());
      stats.n_loaded_from[size_t(tiers_.store_tier(store_.record(out)))] += int(src.tokens.size());
      store_.record(out).source = a;
    } else {
      kv::Message& m = store_.create();
      m.model = model;
      m.source = a;
      m.variant = variant;
      m.repair = repair_tag;
      m.tokens = src.tokens;
      m.start_pos = src.start_pos;
      m.parents = std::move(parents);
      m.agent = src.agent;
      m.visibility = src.visibility;
      // Who reads this copy is not known here, except that a's own model reads a instead (known() above).
      std::vector<int> readers;
      for (int r = 0; r < int(models_.size()); ++r)
        if (!same_model(r, src.model)) readers.push_back(r);
      m.e_layers = models_.e_cache_layers(model, readers);
      try {
        Held held(store_);
        std::vector<PlacedView> views = tiers_.hold_parents(m, held, &stats);
        if (variant != 0) {
          tiers_.hold(a, held, &stats);  // its KV is copied
          encode_partial(m, store_.record(a), plan, views, stats);
        } else {
          Work w{&m, std::move(views), false, {}};
          if (repair_tag != 0) apply_repair(w, RepairPolicy::from_tag(repair_tag), nullptr, nullptr);
          Work* wp = &w;
          encode(std::span<Work*>(&wp, 1));
        }
      } catch (...) {
        store_.erase(m.id);
        throw;
      }
      store_.publish(m);
      tiers_.made(m, /*prefill=*/true);  // a plan's encoding (variant) is this engine's alone: never written
      stats.n_cross_model += int(m.tokens.size());
      out = m.id;
    }
    encodings_on_[{a, model}] = out;
  }
  return *known(id);
}

void Engine::encode_partial(kv::Message& m, const kv::Message& src, const CrossModelPlan& plan,
                            const std::vector<PlacedView>& views, CallStats& stats) {
  const kv::PagePool& pool = store_.pool();
  const int n_tokens = int(src.tokens.size());
  // The sender's KV, every layer; the planned layers are overwritten below.
  const size_t n_pages = pool.layout().pages_for(size_t(n_tokens));
  const std::vector<std::byte> host = src.pages.to_host(n_pages);
  m.pages.reserve(n_tokens);
  m.pages.upload(host.data(), n_pages);
  m.n_encoded = n_tokens;
  const int receiver = m.model;
  const size_t dim = size_t(models_[size_t(receiver)].weights->config().dim);
  // The sender's E caches: in memory with it, else in its T2 or T3 entry (read for this encoding only).
  std::map<int, std::vector<float>> from_store;
  const auto saved = [&](int layer) -> const float* {
    using ECache = std::map<int, std::vector<float>>;
    for (const ECache* e : {static_cast<const ECache*>(&src.e_cache), static_cast<const ECache*>(&from_store)}) {
      const auto it = e->find(layer);
      if (it != e->end() && it->second.size() == size_t(n_tokens) * dim) return it->second.data();
    }
    return nullptr;
  };
  std::vector<int> missing;  // ascending, as the plan's ranges are
  for (const LayerRange& r : plan.ranges)
    if (r.begin < r.end && !saved(r.begin)) missing.push_back(r.begin);
  if (!missing.empty() && src.e_stored) {
    from_store = tiers_.stored_e_cache(src, missing);
    std::erase_if(missing, [&](int layer) { return saved(layer) != nullptr; });
  }
  std::map<int, std::vector<float>> recomputed;
  if (!missing.empty()) {
    // No E cache (not saved, or loaded from a store without one): the sender's layers [0, last missing) run
    // again over the same parents, whose KV at those layers is the sender's, behind the sender's BOS and
    // with its adapters; they rewrite the bits those layers already hold.
    const double e_start = steady_ms();
    m.model = src.model;
    m.n_encoded = 0;
    Work w{&m, views, false, {}};
    w.captured = &recomputed;
    Work* wp = &w;
    try {
      encode_on(*models_[size_t(src.model)].weights, std::span<Work*>(&wp, 1), {0, missing.back(), missing});
    } catch (...) {
      m.model = receiver;
      throw;
    }
    m.model = receiver;
    stats.n_e_recomputed += n_tokens;
    tiers_.count_e_recompute(uint64_t(n_tokens), steady_ms() - e_start);
  }
  for (const LayerRange& r : plan.ranges) {
    if (r.begin == r.end) continue;
    m.n_encoded = 0;
    Work w{&m, views, false, {}};
    w.x_in = saved(r.begin) ? saved(r.begin) : recomputed.at(r.begin).data();
    Work* wp = &w;
    encode_on(*models_[size_t(receiver)].weights, std::span<Work*>(&wp, 1), {r.begin, r.end, {}});
  }
}

}  // namespace choreo::runtime
