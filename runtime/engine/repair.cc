// Repairing reused KV without training (docs/profile.md, "Repairing reused KV"). A call that reads a cached
// parent away from its exact prefix position attends to keys and values that were encoded without the parents
// before it in the call. A repair policy recomputes some of that parent's tokens in the call's context:
// - first:K (EPIC): the first K tokens of each such parent, at every layer;
// - select:R (CacheBlend): every token of those parents at layers 0 and 1, then at each of layers 2, 3 and 4
//   the tokens whose K/V at the layer before deviated most from the cached K/V (1.5 R, 1.25 R, then R of
//   them), that last set at every later layer.
// Each recomputed token attends to the implicit BOS, to the parents before its own in the call's list (as
// repaired), and to the earlier tokens of its own parent (recomputed ones as recomputed, the others as
// cached). The recomputed K/V go to a copy of the parent's pages that only this call reads (Work::repaired):
// the cached message, its content key and every other reader are untouched. The copy keeps the parent's own
// frame of positions (its keys rotated where it was encoded, read at the call's delta like the original), so
// a recomputed token runs at the parent's encoded position and reads everything before it shifted back by
// the parent's delta: the same relative positions as in the call.

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "runtime/engine/engine.h"
#include "runtime/engine/engine_work.h"

namespace choreo::runtime {

namespace {

/// select:R, CacheBlend's gradual filtering: the fraction of the candidate tokens (every token of the
/// parents repaired) recomputed at `layer`. All of them at layers 0 and 1 (the K/V of layer 0 does not depend
/// on the context, so layer 1 is the first where a deviation shows), then a set narrowed from the layer
/// before, from slightly more than R down to R at layer kLastNarrowedLayer and after.
constexpr int kLastNarrowedLayer = 4;
double select_fraction_at(int layer, double r) {
  if (layer <= 1) return 1.0;
  const double f = layer == 2 ? 1.5 * r : layer == 3 ? 1.25 * r : r;
  return std::min(1.0, f);
}

/// ceil(fraction * n), at least 1, without rounding pushing an exact count up by one: R is held as a float
/// (select:0.3 is 0.300000012), so a product of 9.0000004 means 9.
size_t count_of(double fraction, size_t n) {
  const double exact = fraction * double(n);
  const size_t count = size_t(std::ceil(exact - 1e-6 * std::max(1.0, exact)));
  return std::clamp<size_t>(count, 1, n);
}

}  // namespace

RepairPolicy Engine::repair_policy(const std::optional<RepairPolicy>& requested) const {
  // The baselines re-encode every prompt whole: nothing they read is out of place.
  if (mode_ != Mode::Choreo) return {};
  if (repair_) return *repair_;
  return requested.value_or(RepairPolicy{});
}

std::vector<bool> Engine::inexact_views(std::span<const PlacedView> views, int model) const {
  std::vector<bool> inexact(views.size(), true);
  for (size_t i = 0; i < views.size(); ++i) {
    const kv::Message& m = store_.record(views[i].message);
    bool exact = views[i].delta == 0 && same_model(m.model, model) && m.variant == 0 && m.repair == 0 &&
                 m.parents.size() == i;
    for (size_t j = 0; exact && j < i; ++j) {
      const kv::PlacedParent& p = m.parents[j];
      const int whole = int(store_.record(views[j].message).tokens.size());
      exact = p.message == views[j].message && p.offset == views[j].offset &&
              (p.n_tokens < 0 ? whole : p.n_tokens) == views[j].n_tokens;
    }
    // Once one view is not exact, nothing after it is: its encoding saw the cached KV, not the call's.
    if (!exact) break;
    inexact[i] = false;
  }
  return inexact;
}

void Engine::apply_repair(Work& w, const RepairPolicy& policy, CallStats* stats,
                          std::vector<RepairedParent>* report) {
  if (policy.none()) return;
  const std::vector<bool> inexact = inexact_views(w.views, w.msg->model);
  kv::PagePool& pool = store_.pool();
  std::vector<RepairRow> all;  // every token of every view repaired, by view then token
  w.repaired.clear();
  w.repaired.resize(w.views.size());
  for (size_t i = 0; i < w.views.size(); ++i) {
    const PlacedView& v = w.views[i];
    if (!inexact[i] || v.n_tokens == 0) continue;
    const kv::Message& parent = store_.record(v.message);
    auto copy = std::make_unique<kv::PageList>(pool);
    copy->reserve(v.n_tokens);
    for (size_t p = 0; p < copy->pages().size(); ++p)
      pool.backend().copy_page(copy->pages()[p], parent.pages.pages()[p], {0, pool.page_bytes()});
    w.repaired[i] = std::move(copy);
    for (int t = 0; t < v.n_tokens; ++t) all.push_back({i, t});
  }
  if (all.empty()) {
    w.repaired.clear();
    return;
  }
  w.msg->repair = policy.tag();
  const model::Model& weights = *models_[size_t(w.msg->model)].weights;
  const int n_layers = weights.config().n_layers;
  const size_t dim = size_t(weights.config().dim);
  std::vector<int> layers(all.size(), 0);  // per token of `all`: recomputed at layers [0, n)
  if (policy.kind == RepairPolicy::Kind::First) {
    std::vector<RepairRow> rows;
    std::vector<size_t> at;
    for (size_t k = 0; k < all.size(); ++k)
      if (all[k].token < policy.first_tokens) {
        rows.push_back(all[k]);
        at.push_back(k);
      }
    repair_pass(w, rows, 0, n_layers, nullptr, nullptr);
    for (size_t k : at) layers[k] = n_layers;
  } else {
    const double r = policy.select_fraction;
    std::vector<size_t> chosen(all.size());  // indices into `all`, ascending
    std::iota(chosen.begin(), chosen.end(), size_t(0));
    std::vector<RepairRow> rows = all;
    std::vector<float> hidden;  // per chosen token: its hidden state at the input of `layer`
    int layer = std::min(2, n_layers);
    repair_pass(w, rows, 0, layer, nullptr, layer < n_layers ? &hidden : nullptr);
    std::fill(layers.begin(), layers.end(), layer);
    while (layer < n_layers) {
      const size_t keep = std::min(chosen.size(), count_of(select_fraction_at(layer, r), all.size()));
      if (keep < chosen.size()) {
        // The tokens whose K/V at the layer before deviate most from the cached ones go on (ties: the
        // earlier token first).
        const std::vector<double> deviation = repair_deviation(w, rows, layer - 1);
        std::vector<size_t> order(chosen.size());
        std::iota(order.begin(), order.end(), size_t(0));
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return deviation[a] > deviation[b]; });
        order.resize(keep);
        std::sort(order.begin(), order.end());
        std::vector<size_t> next_chosen;
        std::vector<RepairRow> next_rows;
        std::vector<float> next_hidden;
        for (size_t o : order) {
          next_chosen.push_back(chosen[o]);
          next_rows.push_back(rows[o]);
          next_hidden.insert(next_hidden.end(), hidden.begin() + std::ptrdiff_t(o * dim),
                             hidden.begin() + std::ptrdiff_t((o + 1) * dim));
        }
        chosen = std::move(next_chosen);
        rows = std::move(next_rows);
        hidden = std::move(next_hidden);
      }
      const int end = layer >= kLastNarrowedLayer ? n_layers : layer + 1;
      std::vector<float> next;
      repair_pass(w, rows, layer, end, hidden.data(), end < n_layers ? &next : nullptr);
      for (size_t k : chosen) layers[k] = end;
      hidden = std::move(next);
      layer = end;
    }
  }
  int64_t token_layers = 0;
  for (int n : layers) token_layers += n;
  const int repaired = int((token_layers + n_layers - 1) / n_layers);
  if (stats) {
    stats->n_repaired += repaired;
    stats->n_computed += repaired;
    stats->n_reused -= repaired;
  }
  if (report)
    for (size_t k = 0; k < all.size(); ++k) {
      if (k == 0 || all[k].view != all[k - 1].view) report->push_back({w.views[all[k].view].message, {}});
      report->back().layers.push_back(layers[k]);
    }
}

void Engine::repair_pass(Work& w, std::span<const RepairRow> rows, int first_layer, int end_layer,
                         const float* x_in, std::vector<float>* captured) {
  const EngineModel& on = models_[size_t(w.msg->model)];
  const model::Model& weights = *on.weights;
  const size_t dim = size_t(weights.config().dim);
  const kv::MessageId bos = bos_[size_t(w.msg->model)];
  if (captured) captured->assign(rows.size() * dim, 0.0f);
  // Passes of at most max_batch_ rows, in order: a later pass reads what the earlier ones wrote, as a prompt
  // encoded in steps does.
  for (size_t begin = 0; begin < rows.size();) {
    const size_t end = std::min(rows.size(), begin + size_t(max_batch_));
    batch_.clear();
    batch_.kv = store_.pool().layout();
    batch_.first_layer = first_layer;
    batch_.end_layer = end_layer;
    for (size_t i = begin; i < end;) {
      // One group: consecutive tokens of one view.
      size_t j = i + 1;
      while (j < end && rows[j].view == rows[i].view && rows[j].token == rows[j - 1].token + 1) ++j;
      const PlacedView& v = w.views[rows[i].view];
      const kv::Message& parent = store_.record(v.message);
      const kv::PageList& copy = *w.repaired[rows[i].view];
      model::Batch::Group g;
      g.q_begin = batch_.size();
      for (size_t k = i; k < j; ++k) {
        const int t = rows[k].token;
        batch_.tokens.push_back(parent.tokens[size_t(t)]);
        batch_.positions.push_back(parent.start_pos + t);
        batch_.kv_page.push_back(copy.page_of(t));
        batch_.kv_slot.push_back(copy.slot_of(t));
      }
      g.q_end = batch_.size();
      // In the parent's frame, everything the call places before it sits v.delta positions earlier.
      if (bos != kv::kNoMessage) g.segments.push_back({store_.get(bos).pages.pages(), 1, -v.delta, -1});
      for (size_t p = 0; p < rows[i].view; ++p) {
        const PlacedView& before = w.views[p];
        const std::vector<kernels::PageId>& pages =
            w.repaired[p] ? w.repaired[p]->pages() : store_.record(before.message).pages.pages();
        g.segments.push_back({pages, before.n_tokens, before.delta - v.delta, -1});
      }
      g.segments.push_back({copy.pages(), rows[j - 1].token + 1, 0, rows[i].token});
      g.lora = on.lora.empty() ? nullptr : &on.lora;
      batch_.groups.push_back(std::move(g));
      i = j;
    }
    if (x_in) batch_.x_in = x_in + begin * dim;
    if (captured) {
      batch_.capture_layers = {end_layer};
      batch_.capture = captured->data() + begin * dim;
    }
    weights.forward(batch_, state_, nullptr);
    begin = end;
  }
}

std::vector<double> Engine::repair_deviation(const Work& w, std::span<const RepairRow> rows,
                                             int layer) const {
  const kv::PagePool& pool = store_.pool();
  kernels::Backend& backend = pool.backend();
  const kernels::KvLayout& layout = pool.layout();
  // Layer `layer` of a page, alone: its K then its V, as a one-layer page of the same shape.
  kernels::KvLayout one = layout;
  one.n_layers = 1;
  const kernels::ByteRange k = layout.layer_k(layer), v = layout.layer_v(layer);
  struct Pages {
    std::vector<std::byte> repaired, cached;
  };
  std::map<size_t, Pages> host;  // per view
  std::vector<kernels::Completion> copies;
  for (const RepairRow& row : rows) {
    if (host.contains(row.view)) continue;
    Pages& h = host[row.view];
    const std::vector<kernels::PageId>& repaired = w.repaired[row.view]->pages();
    const std::vector<kernels::PageId>& cached = store_.record(w.views[row.view].message).pages.pages();
    h.repaired.resize(repaired.size() * one.page_bytes());
    h.cached.resize(repaired.size() * one.page_bytes());
    for (size_t p = 0; p < repaired.size(); ++p)
      for (auto [pages, to] : {std::pair{&repaired, &h.repaired}, std::pair{&cached, &h.cached}}) {
        std::byte* page = to->data() + p * one.page_bytes();
        copies.push_back(backend.copy_to_host((*pages)[p], k, page));
        copies.push_back(backend.copy_to_host((*pages)[p], v, page + one.layer_v(0).offset));
      }
  }
  for (const kernels::Completion& c : copies) c.wait();
  const size_t kv_dim = size_t(layout.kv_dim());
  std::vector<float> fresh(kv_dim), cached(kv_dim);
  const auto squared_distance = [&] {
    double d = 0;
    for (size_t i = 0; i < kv_dim; ++i) d += (double(fresh[i]) - cached[i]) * (double(fresh[i]) - cached[i]);
    return d;
  };
  std::vector<double> out;
  out.reserve(rows.size());
  for (const RepairRow& row : rows) {
    const Pages& h = host.at(row.view);
    const size_t offset = size_t(row.token / layout.page_tokens) * one.page_bytes();
    const int slot = row.token % layout.page_tokens;
    one.read_k(h.repaired.data() + offset, 0, slot, fresh.data());
    one.read_k(h.cached.data() + offset, 0, slot, cached.data());
    double d = squared_distance();
    one.read_v(h.repaired.data() + offset, 0, slot, fresh.data());
    one.read_v(h.cached.data() + offset, 0, slot, cached.data());
    d += squared_distance();
    out.push_back(d);
  }
  return out;
}

}  // namespace choreo::runtime
