// Repairing reused KV without training (docs/profile.md, "Repairing reused KV"). A call that reads a cached
// parent away from its exact prefix position attends to keys and values that were encoded without the parents
// before it in the call. A repair policy recomputes some of that parent's tokens in the call's context:
// - first:K (EPIC): the first K tokens of each such parent, at every layer, in the call's own first forward
//   pass (Engine::encode_on);
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
#include <memory>
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

// One job's part of apply_repairs: every token of every view it repairs, and per token, the layers [0, n)
// recomputed so far; for select:R, the tokens still chosen and their hidden states.
struct Engine::RepairState {
  std::vector<RepairRow> all;   // by view, then token
  std::vector<int> layers;      // per row of `all`
  std::vector<size_t> chosen;   // indices into `all`, ascending
  std::vector<RepairRow> rows;  // all[chosen[k]]
  std::vector<float> hidden;    // per chosen row: its hidden state at the input of the next pass
};

void Engine::apply_repairs(std::span<const RepairJob> jobs) {
  std::vector<RepairState> state(jobs.size());
  // Per (model, policy): the jobs that run their passes together.
  std::map<std::pair<int, uint64_t>, std::vector<size_t>> groups;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].policy.none() || !prepare_repair(jobs[j], j, state[j])) continue;
    jobs[j].work->msg->repair = jobs[j].policy.tag();
    groups[{jobs[j].work->msg->model, jobs[j].policy.tag()}].push_back(j);
  }
  for (const auto& [key, members] : groups) {
    const RepairPolicy policy = RepairPolicy::from_tag(key.second);
    if (policy.kind == RepairPolicy::Kind::Select) {
      select_repairs(jobs, members, key.first, policy.select_fraction, state);
      continue;
    }
    // first:K: left to the works' own first encoding pass (Work::pending_repair, Engine::encode_on).
    const int n_layers = models_[size_t(key.first)].weights->config().n_layers;
    for (size_t j : members)
      for (size_t k = 0; k < state[j].all.size(); ++k)
        if (state[j].all[k].token < policy.first_tokens) {
          jobs[j].work->pending_repair.push_back({state[j].all[k].view, state[j].all[k].token});
          state[j].layers[k] = n_layers;
        }
  }
  for (size_t j = 0; j < jobs.size(); ++j)
    if (!state[j].all.empty()) account_repair(jobs[j], state[j]);
}

bool Engine::prepare_repair(const RepairJob& job, size_t j, RepairState& st) {
  kv::PagePool& pool = store_.pool();
  Work& w = *job.work;
  const std::vector<bool> inexact = inexact_views(w.views, w.msg->model);
  w.repaired.clear();
  w.repaired.resize(w.views.size());
  w.repaired_pages.clear();
  w.repaired_pages.resize(w.views.size());
  for (size_t i = 0; i < w.views.size(); ++i) {
    const PlacedView& v = w.views[i];
    if (!inexact[i] || v.n_tokens == 0) continue;
    // Only the pages holding tokens the policy recomputes are copied (first:K: the first K tokens'); the
    // call reads the parent's own pages after them.
    const int touched = job.policy.kind == RepairPolicy::Kind::First ? std::min(v.n_tokens, job.policy.first_tokens)
                                                                     : v.n_tokens;
    const std::vector<kernels::PageId>& cached = store_.record(v.message).pages.pages();
    auto copy = std::make_unique<kv::PageList>(pool);
    copy->reserve(touched);
    for (size_t p = 0; p < copy->pages().size(); ++p)
      pool.backend().copy_page(copy->pages()[p], cached[p], {0, pool.page_bytes()});
    std::vector<kernels::PageId>& pages = w.repaired_pages[i];
    pages = copy->pages();
    pages.insert(pages.end(), cached.begin() + std::ptrdiff_t(copy->pages().size()),
                 cached.begin() + std::ptrdiff_t(pool.layout().pages_for(size_t(v.n_tokens))));
    w.repaired[i] = std::move(copy);
    for (int t = 0; t < v.n_tokens; ++t) st.all.push_back({j, i, t});
  }
  if (st.all.empty()) {
    w.repaired.clear();
    w.repaired_pages.clear();
    return false;
  }
  st.layers.assign(st.all.size(), 0);
  return true;
}

void Engine::select_repairs(std::span<const RepairJob> jobs, const std::vector<size_t>& members, int model,
                            double r, std::vector<RepairState>& state) {
  const int n_layers = models_[size_t(model)].weights->config().n_layers;
  const size_t dim = size_t(models_[size_t(model)].weights->config().dim);
  for (size_t j : members) {
    RepairState& st = state[j];
    st.chosen.resize(st.all.size());
    std::iota(st.chosen.begin(), st.chosen.end(), size_t(0));
    st.rows = st.all;
  }
  // Every pass runs the members' chosen rows together; each member narrows its own set.
  const auto run_pass = [&](int first, int end) {
    std::vector<RepairRow> rows;
    std::vector<float> x_in;
    for (size_t j : members) {
      rows.insert(rows.end(), state[j].rows.begin(), state[j].rows.end());
      x_in.insert(x_in.end(), state[j].hidden.begin(), state[j].hidden.end());
    }
    std::vector<float> captured;
    repair_pass(jobs, rows, first, end, first == 0 ? nullptr : x_in.data(), end < n_layers ? &captured : nullptr);
    size_t at = 0;
    for (size_t j : members) {
      RepairState& st = state[j];
      for (size_t k : st.chosen) st.layers[k] = end;
      if (end < n_layers)
        st.hidden.assign(captured.begin() + std::ptrdiff_t(at * dim),
                         captured.begin() + std::ptrdiff_t((at + st.rows.size()) * dim));
      else
        st.hidden.clear();
      at += st.rows.size();
    }
  };
  int layer = std::min(2, n_layers);
  run_pass(0, layer);
  while (layer < n_layers) {
    for (size_t j : members) {
      RepairState& st = state[j];
      const size_t keep = std::min(st.chosen.size(), count_of(select_fraction_at(layer, r), st.all.size()));
      if (keep < st.chosen.size()) narrow_repair(*jobs[j].work, st, layer - 1, keep, dim);
    }
    const int end = layer >= kLastNarrowedLayer ? n_layers : layer + 1;
    run_pass(layer, end);
    layer = end;
  }
}

void Engine::narrow_repair(const Work& w, RepairState& st, int layer, size_t keep, size_t dim) const {
  const std::vector<double> deviation = repair_deviation(w, st.rows, layer);
  std::vector<size_t> order(st.chosen.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return deviation[a] > deviation[b]; });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  std::vector<size_t> chosen;
  std::vector<RepairRow> rows;
  std::vector<float> hidden;
  for (size_t o : order) {
    chosen.push_back(st.chosen[o]);
    rows.push_back(st.rows[o]);
    hidden.insert(hidden.end(), st.hidden.begin() + std::ptrdiff_t(o * dim),
                  st.hidden.begin() + std::ptrdiff_t((o + 1) * dim));
  }
  st.chosen = std::move(chosen);
  st.rows = std::move(rows);
  st.hidden = std::move(hidden);
}

void Engine::account_repair(const RepairJob& job, const RepairState& st) const {
  const int n_layers = models_[size_t(job.work->msg->model)].weights->config().n_layers;
  int64_t token_layers = 0;
  for (int n : st.layers) token_layers += n;
  const int repaired = int((token_layers + n_layers - 1) / n_layers);
  if (job.stats) {
    job.stats->n_repaired += repaired;
    job.stats->n_computed += repaired;
    job.stats->n_reused -= repaired;
  }
  if (job.report)
    for (size_t k = 0; k < st.all.size(); ++k) {
      if (k == 0 || st.all[k].view != st.all[k - 1].view)
        job.report->push_back({job.work->views[st.all[k].view].message, {}});
      job.report->back().layers.push_back(st.layers[k]);
    }
}

void Engine::repair_pass(std::span<const RepairJob> jobs, std::span<const RepairRow> rows, int first_layer,
                         int end_layer, const float* x_in, std::vector<float>* captured) {
  if (rows.empty()) return;
  const model::Model& weights = *models_[size_t(jobs[rows.front().job].work->msg->model)].weights;
  const size_t dim = size_t(weights.config().dim);
  if (captured) captured->assign(rows.size() * dim, 0.0f);
  // Passes of at most max_batch_ rows, in order: a later pass reads what the earlier ones wrote, as a prompt
  // encoded in steps does.
  for (size_t begin = 0; begin < rows.size();) {
    const size_t end = std::min(rows.size(), begin + size_t(max_batch_));
    batch_.clear();
    batch_.kv = store_.pool().layout();
    batch_.first_layer = first_layer;
    batch_.end_layer = end_layer;
    add_repair_rows(jobs, rows.subspan(begin, end - begin));
    if (x_in) batch_.x_in = x_in + begin * dim;
    if (captured) {
      batch_.capture_layers = {end_layer};
      batch_.capture = captured->data() + begin * dim;
    }
    weights.forward(batch_, state_, nullptr);
    begin = end;
  }
}

void Engine::add_repair_rows(std::span<const RepairJob> jobs, std::span<const RepairRow> rows) {
  for (size_t i = 0; i < rows.size();) {
    // One group: consecutive tokens of one view of one job.
    size_t j = i + 1;
    while (j < rows.size() && rows[j].job == rows[i].job && rows[j].view == rows[i].view &&
           rows[j].token == rows[j - 1].token + 1)
      ++j;
    const Work& w = *jobs[rows[i].job].work;
    const EngineModel& on = models_[size_t(w.msg->model)];
    const kv::MessageId bos = bos_[size_t(w.msg->model)];
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
          w.repaired[p] ? w.repaired_pages[p] : store_.record(before.message).pages.pages();
      g.segments.push_back({pages, before.n_tokens, before.delta - v.delta, -1});
    }
    g.segments.push_back({w.repaired_pages[rows[i].view], rows[j - 1].token + 1, 0, rows[i].token});
    g.lora = on.lora.empty() ? nullptr : &on.lora;
    batch_.groups.push_back(std::move(g));
    i = j;
  }
}

std::pair<std::vector<Engine::RepairJob>, std::vector<Engine::RepairRow>> Engine::take_pending_repairs(
    std::span<Work*> work) {
  std::pair<std::vector<RepairJob>, std::vector<RepairRow>> out;
  for (Work* w : work) {
    if (w->pending_repair.empty()) continue;
    out.first.push_back({w, {}, nullptr, nullptr});
    for (const auto& [view, token] : w->pending_repair) out.second.push_back({out.first.size() - 1, view, token});
    w->pending_repair.clear();
  }
  return out;
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
    const std::vector<kernels::PageId>& repaired = w.repaired_pages[row.view];
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
