#include "runtime/engine/engine.h"
#include "runtime/engine/engine_work.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include <xxhash.h>

#include "common/clock.h"
#include "common/error.h"
#include "runtime/engine/mode.h"
#include "runtime/engine/stop_strings.h"
#include "runtime/store/disk_store.h"
#include "runtime/store/redis_store.h"

namespace choreo::runtime {

namespace {

/// Generated tokens as the text they continue the prompt with: the pieces joined as they are (detokenize
/// would drop a SentencePiece leading space, which belongs to the continuation here).
std::string continuation_text(const model::Vocab& vocab, std::span<const model::Token> tokens) {
  std::string text;
  for (model::Token t : tokens) text += vocab.token_to_piece(t);
  return text;
}

}  // namespace

std::string_view mode_name(Mode m) {
  switch (m) {
    case Mode::Choreo: return "choreo";
    case Mode::Naive: return "naive";
    case Mode::Prefix: return "prefix";
  }
  return "?";
}

Mode parse_mode(std::string_view name) {
  if (name == "choreo") return Mode::Choreo;
  if (name == "naive") return Mode::Naive;
  if (name == "prefix") return Mode::Prefix;
  throw InputError(fmt::format("unknown mode '{}'", name), "use choreo, prefix or naive");
}

namespace {
std::vector<uint64_t> fingerprints(const ModelSet& models) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < models.size(); ++i) out.push_back(models[i].fingerprint);
  return out;
}
}  // namespace

Engine::Engine(const model::Model& model, kv::PagePool& pool, Mode mode, int max_batch, const model::LoraStack* lora)
    : Engine(ModelSet(model, lora ? *lora : model::LoraStack{}), pool, mode, max_batch) {}

Engine::Engine(ModelSet models, kv::PagePool& pool, Mode mode, int max_batch)
    : models_(std::move(models)),
      tiers_(pool, store_, models_, models_.n_ctx(), [this](kv::Message& m, CallStats* s) { recompute(m, s); }),
      store_(pool, fingerprints(models_)),
      mode_(mode),
      max_batch_(max_batch),
      n_ctx_(models_.n_ctx()) {
  device_sampling_ = model().backend().prefers_device_sampling();
  const model::Vocab& vocab = model().vocab();
  bos_.assign(models_.size(), kv::kNoMessage);
  if (vocab.add_bos() && vocab.bos() >= 0) {
    // The implicit BOS every call sees at position 0, encoded once per model.
    for (size_t i = 0; i < models_.size(); ++i) {
      kv::Message& bos = store_.create();
      bos.model = int(i);
      bos.tokens = {vocab.bos()};
      bos.start_pos = 0;
      Work w{&bos, {}, false, {}};
      Work* wp = &w;
      encode(std::span<Work*>(&wp, 1));
      store_.publish(bos);
      bos.pins = 1;
      bos_[i] = bos.id;
    }
  }
  tiers_.set_bos(bos_);
  tiers_.start();  // the page pool asks the tier manager for room from now on
  const ModeContext context{store_, first_pos(), n_ctx_};
  switch (mode) {
    case Mode::Choreo: call_mode_ = make_choreo_mode(context); break;
    case Mode::Naive: call_mode_ = make_naive_mode(context); break;
    case Mode::Prefix: call_mode_ = make_prefix_mode(context); break;
  }
}

Engine::~Engine() { tiers_.stop(); }

bool Engine::is_bos(kv::MessageId id) const { return std::find(bos_.begin(), bos_.end(), id) != bos_.end(); }

void Engine::check_model(int model, std::string_view call, size_t index) const {
  if (model < 0 || size_t(model) >= models_.size())
    throw InputError(fmt::format("{} #{} names model {}; the engine has {} model{}", call, index, model,
                                 models_.size(), models_.size() == 1 ? "" : "s"),
                     "give a model index below the number of models");
}

std::vector<kernels::KvSegment> Engine::segments_for(Work& w, int bos_model) {
  std::vector<kernels::KvSegment> segs;
  const kv::MessageId bos = bos_[size_t(bos_model >= 0 ? bos_model : w.msg->model)];
  if (bos != kv::kNoMessage && w.msg->id != bos) {
    const kv::Message& b = store_.get(bos);
    segs.push_back({b.pages.pages(), 1, 0, -1});
  }
  for (size_t i = 0; i < w.views.size(); ++i) {
    const PlacedView& v = w.views[i];
    // The call's own repaired copy of the parent (repair.cc), else the parent's pages; a released parent is
    // read by its record, while a child is recomputed.
    const std::vector<kernels::PageId>& pages = i < w.repaired.size() && w.repaired[i]
                                                    ? w.repaired_pages[i]
                                                    : store_.record(v.message).pages.pages();
    const model::Model& weights = *models_[size_t(w.msg->model)].weights;
    if (v.delta != 0 && repositioning_ == Repositioning::KeyRerotation) {
      // Reference path: a copy of the parent whose keys the backend re-rotates by +delta, attended with delta 0.
      auto copy = std::make_unique<kv::PageList>(store_.pool());
      copy->reserve(v.n_tokens);
      const std::span<const kernels::PageId> parent_pages(pages.data(), copy->pages().size());
      store_.pool().backend().rerotate_keys(store_.pool().layout(), parent_pages, copy->pages(), v.n_tokens,
                                            v.delta, weights.rope_params());
      segs.push_back({copy->pages(), v.n_tokens, 0, -1});
      rerotated_.push_back(std::move(copy));
      continue;
    }
    segs.push_back({pages, v.n_tokens, v.delta, -1});
  }
  return segs;
}

void Engine::encode(std::span<Work*> work) {
  // Calls on one weights file share each step's forward pass, whatever their adapters (Batch::Group::lora);
  // each other weights file has a pass of its own, and so have models whose messages save their hidden
  // states at another layer (the E cache of a `partial` cross-model plan).
  using Key = std::pair<const model::Model*, std::vector<int>>;
  const auto on = [&](const Work* w) {
    return Key{models_[size_t(w->msg->model)].weights, w->msg->e_layers};
  };
  const auto encode_part = [&](const Key& key, std::span<Work*> part) {
    if (!key.second.empty())
      for (Work* w : part) w->captured = &w->msg->e_cache;
    encode_on(*key.first, part, {0, -1, key.second});
  };
  const Key first = work.empty() ? Key{} : on(work.front());
  if (std::all_of(work.begin(), work.end(), [&](const Work* w) { return on(w) == first; })) {
    if (!work.empty()) encode_part(first, work);
    return;
  }
  std::vector<Key> seen;
  for (const Work* w : work) {
    if (std::find(seen.begin(), seen.end(), on(w)) != seen.end()) continue;
    seen.push_back(on(w));
    std::vector<Work*> part;
    for (Work* x : work)
      if (on(x) == on(w)) part.push_back(x);
    encode_part(on(w), part);
  }
}

void Engine::encode_on(const model::Model& weights, std::span<Work*> work, LayerPass pass) {
  const int n_vocab = weights.config().n_vocab;
  const size_t dim = size_t(weights.config().dim);
  // Parent segments do not change while a message is encoded: build them once per call.
  std::vector<std::vector<kernels::KvSegment>> parent_segs(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    Work& w = *work[i];
    // A finished message (nothing pending) is left alone: it may have left T0 meanwhile.
    if (int(w.msg->tokens.size()) <= w.msg->n_encoded) continue;
    w.msg->pages.reserve(int(w.msg->tokens.size()));
    parent_segs[i] = segments_for(w);
  }
  // first:K's recomputation of the works' parents (repair.cc) rides in the first pass, ahead of the works' own
  // rows: at every layer each row's K/V is written before any row attends. A pass that does not start from
  // the token embeddings at layer 0 and run every layer, or rows that would not leave room for the works',
  // run on their own first.
  auto [repair_jobs, repair_rows] = take_pending_repairs(work);
  const bool whole_pass = pass.first == 0 && (pass.end < 0 || pass.end == weights.config().n_layers) &&
                          std::none_of(work.begin(), work.end(), [](const Work* w) { return w->x_in; });
  if (!repair_rows.empty() && (!whole_pass || repair_rows.size() >= size_t(max_batch_))) {
    repair_pass(repair_jobs, repair_rows, 0, weights.config().n_layers, nullptr, nullptr);
    repair_rows.clear();
  }
  for (;;) {
    batch_.clear();
    batch_.kv = store_.pool().layout();
    batch_.first_layer = pass.first;
    batch_.end_layer = pass.end;
    x_in_.clear();
    const size_t n_repair = repair_rows.size();
    add_repair_rows(repair_jobs, repair_rows);
    repair_rows.clear();
    std::vector<std::pair<size_t, int>> taken;  // (work index, tokens taken this step)
    // Only candidates when every work with logits in this pass wants no more (as many as the most any wants).
    int top_k = 0;
    bool only_candidates = true;
    int budget = max_batch_ - int(n_repair);
    for (size_t i = 0; i < work.size() && budget > 0; ++i) {
      kv::Message& m = *work[i]->msg;
      int remaining = int(m.tokens.size()) - m.n_encoded;
      if (remaining <= 0) continue;
      int k = std::min(remaining, budget);
      budget -= k;
      model::Batch::Group g;
      g.q_begin = batch_.size();
      for (int j = 0; j < k; ++j) {
        int idx = m.n_encoded + j;
        batch_.tokens.push_back(m.tokens[idx]);
        batch_.positions.push_back(m.start_pos + idx);
        batch_.kv_page.push_back(m.pages.page_of(idx));
        batch_.kv_slot.push_back(m.pages.slot_of(idx));
      }
      g.q_end = batch_.size();
      if (work[i]->x_in)
        x_in_.insert(x_in_.end(), work[i]->x_in + size_t(m.n_encoded) * dim,
                     work[i]->x_in + size_t(m.n_encoded + k) * dim);
      g.segments = parent_segs[i];
      g.segments.push_back({m.pages.pages(), m.n_encoded + k, 0, m.n_encoded});
      const model::LoraStack& lora = models_[size_t(m.model)].lora;
      g.lora = lora.empty() ? nullptr : &lora;
      batch_.groups.push_back(std::move(g));
      if (work[i]->want_logits && m.n_encoded + k == int(m.tokens.size())) {
        batch_.logit_rows.push_back(g.q_end - 1);
        if (work[i]->candidates > 0)
          top_k = std::max(top_k, std::min(work[i]->candidates, n_vocab));
        else
          only_candidates = false;
      }
      taken.push_back({i, k});
    }
    if (batch_.size() == 0) break;
    if (!only_candidates) top_k = 0;
    const int per_row = top_k > 0 ? top_k : n_vocab;
    logits_.resize(batch_.logit_rows.size() * size_t(per_row));
    if (top_k > 0) {
      top_ids_.resize(logits_.size());
      batch_.top_k = top_k;
      batch_.top_ids = top_ids_.data();
    }
    // Rows of works given input hidden states start from them (all or none of a pass's works have them).
    if (!x_in_.empty()) batch_.x_in = x_in_.data();
    if (!pass.capture.empty()) {
      captured_.resize(pass.capture.size() * size_t(batch_.size()) * dim);
      batch_.capture_layers = pass.capture;
      batch_.capture = captured_.data();
    }
    weights.forward(batch_, state_, logits_.data());
    size_t out = 0;
    size_t row = n_repair;  // the repair rows come first
    for (auto [i, k] : taken) {
      Work& w = *work[i];
      if (w.captured)  // rows for tokens [n_encoded, n_encoded + k), after what earlier steps captured
        for (size_t c = 0; c < pass.capture.size(); ++c) {
          std::vector<float>& rows = (*w.captured)[pass.capture[c]];
          const auto from = captured_.begin() + std::ptrdiff_t((c * size_t(batch_.size()) + row) * dim);
          rows.resize(size_t(w.msg->n_encoded) * dim);
          rows.insert(rows.end(), from, from + std::ptrdiff_t(size_t(k) * dim));
        }
      row += size_t(k);
      w.msg->n_encoded += k;
      if (w.want_logits && w.msg->n_encoded == int(w.msg->tokens.size())) {
        w.logits.assign(logits_.begin() + out * per_row, logits_.begin() + (out + 1) * per_row);
        if (top_k > 0)
          w.candidate_ids.assign(top_ids_.begin() + out * per_row, top_ids_.begin() + (out + 1) * per_row);
        else
          w.candidate_ids.clear();
        ++out;
      }
    }
  }
  rerotated_.clear();
}

void Engine::release(kv::MessageId id) {
  if (!store_.contains(id)) throw InputError(fmt::format("release: unknown message {}", id));
  if (is_bos(id)) throw InputError("release: the implicit BOS message cannot be released");
  if (kv::Message& m = store_.get(id); m.loading) tiers_.settle(m, nullptr);
  call_mode_->forget(id);
  store_.erase(id);
  // Other models' encodings of it go with it (their records stay, as every released message's do).
  for (size_t model = 0; model < models_.size(); ++model) {
    const auto it = encodings_on_.find({id, int(model)});
    if (it == encodings_on_.end()) continue;
    const kv::MessageId other = it->second;
    encodings_on_.erase(it);
    if (store_.contains(other)) release(other);
  }
}

PrefillResult Engine::prefill(const PrefillRequest& request) {
  return prefill_batch(std::span<const PrefillRequest>(&request, 1)).front();
}

std::vector<PrefillResult> Engine::prefill_batch(std::span<const PrefillRequest> requests) {
  const double t0 = steady_ms();
  std::vector<PrefillResult> results(requests.size());
  std::vector<Work> works;
  works.reserve(requests.size());
  std::vector<size_t> work_of(requests.size(), SIZE_MAX);
  std::unordered_map<uint64_t, size_t> first_with_key;
  std::vector<size_t> work_request;  // the request each work was made for
  std::vector<RepairPolicy> work_policy;  // and the repair policy it runs with
  const bool encode_now = call_mode_->encodes_prefills();
  for (size_t i = 0; i < requests.size(); ++i) {
    const PrefillRequest& r = requests[i];
    if (r.tokens.empty()) throw InputError(fmt::format("prefill #{} has no tokens", i), "give some text");
    check_model(r.model, "prefill", i);
    models_[size_t(r.model)].weights->check_tokens(r.tokens, "prefill");
    // A parent another model encoded is read through this model's encoding of it (computed first if need be).
    const std::vector<Parent> parents =
        encode_now ? parents_on(r.model, r.parents, results[i].stats) : r.parents;
    Placement pl = place(store_, parents, r.new_offset, first_pos(), int(r.tokens.size()), n_ctx_, encode_now);
    results[i].stats.start_pos = pl.new_start;
    if (!encode_now) {
      // Kept as text only: decode calls re-encode it.
      results[i].id = new_message(store_, pl, r.agent, r.visibility, r.tokens, r.model).id;
      continue;
    }
    std::vector<kv::PlacedParent> placed;
    for (const PlacedView& v : pl.parents) placed.push_back({v.message, v.offset});
    for (const PlacedView& v : pl.parents) results[i].stats.n_reused += v.n_tokens;
    // Over parents its repair policy repairs (repair.cc), the encoding is another one, with a key of its own.
    const RepairPolicy policy = repair_policy(r.repair);
    const std::vector<bool> inexact =
        policy.none() ? std::vector<bool>() : inexact_views(pl.parents, r.model);
    bool repaired = false;
    for (size_t v = 0; v < inexact.size(); ++v)
      repaired = repaired || (inexact[v] && pl.parents[v].n_tokens > 0);
    const uint64_t repair_tag = repaired ? policy.tag() : 0;
    uint64_t key = store_.content_key(r.tokens, pl.new_start, placed, r.model, 0, repair_tag);
    // An encoding that already exists (or is computed once for an earlier twin in this batch, or loaded
    // from disk below) is reused whole: its tokens count as reused, so n_computed + n_reused is always the
    // request's own tokens plus its parents' visible tokens, however the encoding was obtained.
    if (kv::Message* existing = store_.find(key)) {
      results[i].id = existing->id;
      results[i].deduplicated = true;
      results[i].stats.n_reused += int(r.tokens.size());
      continue;
    }
    if (auto it = first_with_key.find(key); it != first_with_key.end()) {
      work_of[i] = it->second;  // identical to an earlier request of this batch
      results[i].deduplicated = true;
      results[i].stats.n_reused += int(r.tokens.size());
      continue;
    }
    if (std::optional<kv::MessageId> loaded =
            tiers_.has_stores() && repair_tag == 0 ? tiers_.load(key, r.model) : std::nullopt) {
      results[i].id = *loaded;
      results[i].loaded = true;
      results[i].stats.n_reused += int(r.tokens.size());
      results[i].stats.n_loaded_from[size_t(tiers_.store_tier(store_.record(*loaded)))] += int(r.tokens.size());
      continue;
    }
    kv::Message& m = new_message(store_, pl, r.agent, r.visibility, r.tokens, r.model);
    m.e_layers = e_layers_for(r.model, r.read_by);
    works.push_back({&m, pl.parents, false, {}});
    work_policy.push_back(policy);
    work_request.push_back(i);
    work_of[i] = works.size() - 1;
    first_with_key.emplace(key, works.size() - 1);
    results[i].stats.n_computed = int(r.tokens.size());
  }
  Held held(store_);
  for (size_t k = 0; k < works.size(); ++k)
    for (const PlacedView& v : works[k].views) tiers_.hold(v.message, held, &results[work_request[k]].stats);
  tiers_.prefetch_due();  // with this batch's parents held: the loads overlap its compute
  std::vector<RepairJob> repairs;
  for (size_t k = 0; k < works.size(); ++k)
    repairs.push_back({&works[k], work_policy[k], &results[work_request[k]].stats,
                       &results[work_request[k]].repaired});
  apply_repairs(repairs);
  // The calls are independent and the kernels batch invariant, so a batch whose new pages would not fit in
  // half of T0 is encoded in parts that do; each part's messages can leave T0 while the next is encoded.
  const size_t part_pages = std::max<size_t>(1, store_.pool().budget_bytes() / store_.pool().page_bytes() / 2);
  for (size_t first = 0; first < works.size();) {
    std::vector<Work*> part;
    size_t pages = 0;
    for (; first < works.size(); ++first) {
      const size_t need = store_.pool().layout().pages_for(works[first].msg->tokens.size());
      if (!part.empty() && pages + need > part_pages) break;
      part.push_back(&works[first]);
      pages += need;
    }
    encode(part);
    for (Work* w : part) {
      store_.publish(*w->msg);
      tiers_.made(*w->msg, /*prefill=*/true);  // written through to the stores that share or keep it
    }
  }
  if (tiers_.persists_prefills())
    for (Work& w : works)
      if (w.msg->repair == 0) tiers_.persist(w.msg->id, 0);  // a store entry cannot say how it was repaired
  const double t1 = steady_ms();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (work_of[i] != SIZE_MAX) results[i].id = works[work_of[i]].msg->id;
    results[i].stats.ttft_ms = results[i].stats.total_ms = t1 - t0;
  }
  return results;
}

DecodeResult Engine::decode(const DecodeRequest& request) {
  return decode_batch(std::span<const DecodeRequest>(&request, 1)).front();
}

static void fill_logprobs(std::span<const float> logits, model::Token chosen, int k, TokenLogprobs& out) {
  double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  double lse = mx + std::log(sum);
  out.token = chosen;
  out.logprob = float(double(logits[chosen]) - lse);
  std::vector<int> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int(i);
  k = std::min<int>(k, int(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int i = 0; i < k; ++i) out.top.push_back({idx[i], float(double(logits[idx[i]]) - lse)});
}

std::vector<DecodeResult> Engine::decode_batch(std::span<const DecodeRequest> requests) {
  const double t0 = steady_ms();
  const size_t n = requests.size();
  std::vector<DecodeResult> results(n);
  std::vector<DecodeLayout> layouts(n);
  std::vector<Work> works(n);
  for (size_t i = 0; i < n; ++i) {
    const DecodeRequest& r = requests[i];
    if (r.header.empty())
      throw InputError(fmt::format("decode #{} has an empty header", i),
                       "a decode needs at least one header token: the first generated token follows it");
    check_model(r.model, "decode", i);
    models_[size_t(r.model)].weights->check_tokens(r.header, "decode header");
    const int budget = token_budget(r);
    if (budget < 0) throw InputError(fmt::format("decode #{}: max_tokens must not be negative", i));
    models_[size_t(r.model)].weights->check_tokens(r.forced, "forced decode tokens");
    // A parent another model encoded is read through this model's encoding of it (computed first if need be).
    if (call_mode_->encodes_prefills() &&
        std::any_of(r.parents.begin(), r.parents.end(), [&](const Parent& p) {
          return store_.contains(p.message) && !same_model(store_.get(p.message).model, r.model);
        })) {
      DecodeRequest own = r;
      own.parents = parents_on(r.model, r.parents, results[i].stats);
      layouts[i] = call_mode_->lay_out_decode(own, i, budget);
    } else {
      layouts[i] = call_mode_->lay_out_decode(r, i, budget);
    }
    layouts[i].encoded->e_layers = e_layers_for(r.model, r.read_by);
    works[i] = {layouts[i].encoded, layouts[i].views, true, {}};
    results[i].stats.n_reused = layouts[i].n_reused;
    results[i].stats.start_pos = layouts[i].encoded->start_pos;
  }
  // The parents stay in T0 until every call of the batch has finished. The calls' own messages need no hold:
  // a message that is still being encoded is never evicted, and a finished one is not read again here.
  Held held(store_);
  for (size_t i = 0; i < n; ++i)
    for (const PlacedView& v : works[i].views) tiers_.hold(v.message, held, &results[i].stats);
  tiers_.prefetch_due();  // with this batch's parents held: the loads overlap its generation
  std::vector<RepairJob> repairs;
  for (size_t i = 0; i < n; ++i)
    repairs.push_back({&works[i], repair_policy(requests[i].repair), &results[i].stats, &results[i].repaired});
  apply_repairs(repairs);

  generate(requests, works, results, t0);

  const double t1 = steady_ms();
  const model::Vocab& vocab = model().vocab();  // every model of the engine has the base model's vocabulary
  for (size_t i = 0; i < n; ++i) {
    const DecodeRequest& r = requests[i];
    DecodeResult& res = results[i];
    store_.publish(*layouts[i].encoded);
    tiers_.made(*layouts[i].encoded, /*prefill=*/false);
    std::span<const model::Token> visible = res.generated;
    if (!visible.empty() && vocab.is_eog(visible.back()) && !r.exact_tokens && r.forced.empty())
      visible = visible.first(visible.size() - 1);
    res.text = continuation_text(vocab, visible);
    if (const size_t cut = find_stop(res.text, r.stop); cut != std::string::npos) res.text.resize(cut);
    call_mode_->finish_decode(r, layouts[i], res.generated);
    res.id = layouts[i].result->id;
    res.stats.total_ms = t1 - t0;
  }
  return results;
}

int Engine::token_budget(const DecodeRequest& r) {
  return r.forced.empty() ? r.exact_tokens.value_or(r.max_tokens) : int(r.forced.size());
}

void Engine::generate(std::span<const DecodeRequest> requests, std::vector<Work>& works,
                      std::vector<DecodeResult>& results, double t0) {
  const model::Vocab& vocab = model().vocab();  // every model of the engine has the base model's vocabulary
  const size_t n = requests.size();
  // Encode every call's pending tokens (one batched pass), then sample and feed one token per active call per
  // step.
  std::vector<Work*> ptrs;
  for (Work& w : works) ptrs.push_back(&w);
  for (size_t i = 0; i < n; ++i) results[i].stats.n_computed += int(works[i].msg->tokens.size());
  encode(ptrs);
  std::vector<model::Sampler> samplers;
  std::vector<StopScanner> stops;
  for (size_t i = 0; i < n; ++i) {
    const DecodeRequest& r = requests[i];
    samplers.emplace_back(r.sampling);
    stops.emplace_back(r.stop);
    // Only the candidates the sampler reads, when nothing else reads the logits (Engine::set_device_sampling).
    if (device_sampling_ && r.forced.empty() && !r.record_logits && r.logprobs == 0)
      works[i].candidates = r.sampling.temperature <= 0.0f ? 1 : std::max(0, r.sampling.top_k);
  }
  std::vector<bool> active(n, true);
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      if (!active[i]) continue;
      const DecodeRequest& r = requests[i];
      DecodeResult& res = results[i];
      Work& w = works[i];
      const int budget = token_budget(r);
      if (int(res.generated.size()) >= budget) {
        active[i] = false;
        res.stop_reason = "length";
        continue;
      }
      if (!r.forced.empty() && !r.record_logits && r.logprobs == 0) {
        // Teacher forcing with nothing to record per step: every forced token at once, encoded in one pass.
        res.stats.ttft_ms = steady_ms() - t0;
        for (const model::Token t : r.forced) {
          res.generated.push_back(t);
          w.msg->tokens.push_back(t);
          if (r.on_token) r.on_token(t);
        }
        res.stop_reason = "length";
        w.want_logits = false;
        active[i] = false;
        any = true;
        continue;
      }
      const model::Token t = !r.forced.empty()           ? r.forced[res.generated.size()]
                             : w.candidate_ids.empty() ? samplers[i].sample(w.logits)
                                                       : samplers[i].sample_candidates(w.logits, w.candidate_ids);
      if (res.generated.empty()) res.stats.ttft_ms = steady_ms() - t0;
      if (r.record_logits) res.logits.push_back(w.logits);
      if (r.logprobs > 0) {
        res.logprobs.emplace_back();
        fill_logprobs(w.logits, t, r.logprobs, res.logprobs.back());
      }
      res.generated.push_back(t);
      w.msg->tokens.push_back(t);
      if (r.on_token) r.on_token(t);
      bool finished = false;
      if (!r.exact_tokens && r.forced.empty()) {
        if (vocab.is_eog(t)) {
          finished = true;
          res.stop_reason = "eog";
        } else if (stops[i].append(vocab.token_to_piece(t))) {
          finished = true;
          res.stop_reason = "stop";
        }
      }
      if (!finished && r.cancelled && r.cancelled()) {
        finished = true;
        res.stop_reason = "cancelled";
      }
      if (!finished && int(res.generated.size()) >= budget) {
        finished = true;
        res.stop_reason = "length";
      }
      // A finished call's last token is still encoded (without logits), so the message is complete.
      w.want_logits = !finished;
      active[i] = !finished;
      any = true;
    }
    if (!any) break;
    for (size_t i = 0; i < n; ++i)
      results[i].stats.n_computed += int(works[i].msg->tokens.size()) - works[i].msg->n_encoded;
    encode(ptrs);
  }
}

// ---- the tiers and stores (runtime/engine/tiers.h) ------------------------------------------------

void Engine::set_disk_store(store::DiskStore* disk, bool persist_prefills) {
  if (disk) tiers_.add_store(*disk, {.evictions = true, .persist = true, .persist_prefills = persist_prefills});
}

void Engine::set_remote_store(store::RedisStore* remote) {
  if (remote) tiers_.add_store(*remote, {.prefills = true});
}

std::optional<kv::MessageId> Engine::load(uint64_t key, int model) {
  check_model(model, "load", 0);
  if (kv::Message* m = store_.find(key)) return m->id;  // keys cover the model: this is its encoding
  if (!call_mode_->encodes_prefills()) return std::nullopt;
  return tiers_.load(key, model);
}

void Engine::prefetch(kv::MessageId id) {
  if (!store_.contains(id)) throw InputError(fmt::format("prefetch: unknown message {}", id));
  tiers_.make_resident(store_.get(id), nullptr);
}

bool Engine::parent_loading(const std::vector<Parent>& parents, int model) const {
  for (const Parent& p : parents) {
    if (tiers_.loading(p.message)) return true;
    // Another model's message is read through the call's model's encoding of it, which may be loading.
    const auto copy = encodings_on_.find({p.message, model});
    if (copy != encodings_on_.end() && tiers_.loading(copy->second)) return true;
  }
  return false;
}

bool Engine::loading(const PrefillRequest& request) const { return parent_loading(request.parents, request.model); }
bool Engine::loading(const DecodeRequest& request) const { return parent_loading(request.parents, request.model); }

std::vector<int> Engine::e_layers_for(int model, const std::optional<std::vector<int>>& read_by) const {
  return read_by ? models_.e_cache_layers(model, *read_by) : models_.e_cache_layers(model);
}

void Engine::recompute(kv::Message& m, CallStats* stats) {
  Held parents(store_);
  std::vector<PlacedView> views = tiers_.hold_parents(m, parents, stats);
  const int n_tokens = m.n_encoded;
  m.n_encoded = 0;
  Work w{&m, std::move(views), false, {}};
  Work* wp = &w;
  try {
    if (m.variant != 0) {
      // A cross-model plan's encoding: made again from its source the same way (cross_model.cc).
      const kv::Message& src = store_.record(m.source);
      tiers_.hold(m.source, parents, stats);
      CallStats scratch;
      encode_partial(m, src, models_.plan(src.model, m.model), w.views, stats ? *stats : scratch);
    } else {
      // Over parents repaired when it was made: repaired again the same way (repair.cc), the same bits.
      if (m.repair != 0) apply_repair(w, RepairPolicy::from_tag(m.repair), nullptr, nullptr);
      encode(std::span<Work*>(&wp, 1));
    }
  } catch (...) {
    // Back to evicted, whole: a later call recomputes it again.
    m.pages.clear();
    m.n_encoded = n_tokens;
    throw;
  }
}

}  // namespace choreo::runtime
