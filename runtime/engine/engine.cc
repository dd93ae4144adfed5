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
#include "runtime/engine/loading.h"
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

struct Engine::Stored {
  std::optional<store::MappedEntry> mapped;  // T2
  std::vector<uint8_t> bytes;                // T3: the value read
  store::ParsedEntry parsed;                 // T3: its header, checked
  const store::EntryMeta& meta() const { return mapped ? mapped->meta() : parsed.meta; }
  const store::ParsedEntry& entry() const { return mapped ? mapped->parsed : parsed; }
  std::span<const uint8_t> file() const { return mapped ? mapped->file.bytes() : std::span<const uint8_t>(bytes); }
  int tier() const { return mapped ? 2 : 3; }
};

namespace {
/// Bytes of a message's E caches in memory.
size_t e_cache_bytes(const std::map<int, std::vector<float>>& e_cache) {
  size_t bytes = 0;
  for (const auto& [layer, rows] : e_cache) bytes += rows.size() * sizeof(float);
  return bytes;
}

/// The E-cache sections of an entry of m (described by meta, made by entry_meta), in meta's layer order.
std::vector<std::span<const uint8_t>> e_section_spans(const kv::Message& m, const store::EntryMeta& meta) {
  std::vector<std::span<const uint8_t>> out;
  for (uint32_t layer : meta.e_layers) {
    const std::vector<float>& rows = m.e_cache.at(int(layer));
    out.push_back({reinterpret_cast<const uint8_t*>(rows.data()), rows.size() * sizeof(float)});
  }
  return out;
}

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
  store_.pool().set_reclaimer([this] { return evict_one(); });
  const ModeContext context{store_, first_pos(), n_ctx_};
  switch (mode) {
    case Mode::Choreo: call_mode_ = make_choreo_mode(context); break;
    case Mode::Naive: call_mode_ = make_naive_mode(context); break;
    case Mode::Prefix: call_mode_ = make_prefix_mode(context); break;
  }
}

Engine::~Engine() { store_.pool().set_reclaimer(nullptr); }

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
  for (const PlacedView& v : w.views) {
    const kv::Message& m = store_.record(v.message);  // a released parent, while a child is recomputed
    const model::Model& weights = *models_[size_t(w.msg->model)].weights;
    if (v.delta != 0 && repositioning_ == Repositioning::KeyRerotation) {
      // Reference path: a copy of the parent whose keys are rotated by +delta, attended with delta 0. The
      // pages are rotated in host memory and copied back.
      auto copy = std::make_unique<kv::PageList>(store_.pool());
      copy->reserve(v.n_tokens);
      const kernels::KvLayout& kv = store_.pool().layout();
      std::vector<std::byte> host = m.pages.to_host(copy->pages().size());
      std::vector<float> row(kv.kv_dim());
      kernels::Backend& be = weights.backend();
      kernels::Buffer<float> row_on_backend(be, row.size());
      const int32_t delta = v.delta;
      for (size_t p = 0; p < copy->pages().size(); ++p) {
        std::byte* page = host.data() + p * kv.page_bytes();
        int n_in_page = std::min(kv.page_tokens, v.n_tokens - int(p) * kv.page_tokens);
        for (int l = 0; l < kv.n_layers; ++l)
          for (int slot = 0; slot < n_in_page; ++slot) {
            kv.read_k(page, l, slot, row.data());
            row_on_backend.upload(row);
            be.rope(row_on_backend.data(), 1, kv.n_kv_heads, kv.head_dim, &delta, weights.rope_params());
            row_on_backend.download(row);
            kv.write_k(page, l, slot, row.data());
          }
      }
      copy->upload(host.data(), copy->pages().size());
      segs.push_back({copy->pages(), v.n_tokens, 0, -1});
      rerotated_.push_back(std::move(copy));
      continue;
    }
    segs.push_back({m.pages.pages(), v.n_tokens, v.delta, -1});
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
  for (;;) {
    batch_.clear();
    batch_.kv = store_.pool().layout();
    batch_.first_layer = pass.first;
    batch_.end_layer = pass.end;
    x_in_.clear();
    std::vector<std::pair<size_t, int>> taken;  // (work index, tokens taken this step)
    // Only candidates when every work with logits in this pass wants no more (as many as the most any wants).
    int top_k = 0;
    bool only_candidates = true;
    int budget = max_batch_;
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
    if (taken.empty()) break;
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
    size_t row = 0;
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
  if (kv::Message& m = store_.get(id); m.loading) settle(m, nullptr);
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
    uint64_t key = store_.content_key(r.tokens, pl.new_start, placed, r.model);
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
    if (std::optional<kv::MessageId> loaded = disk_ || remote_ ? load_stored(key, 0, r.model) : std::nullopt) {
      results[i].id = *loaded;
      results[i].loaded = true;
      results[i].stats.n_reused += int(r.tokens.size());
      continue;
    }
    kv::Message& m = new_message(store_, pl, r.agent, r.visibility, r.tokens, r.model);
    m.e_layers = e_layers_for(r.model, r.read_by);
    works.push_back({&m, pl.parents, false, {}});
    work_request.push_back(i);
    work_of[i] = works.size() - 1;
    first_with_key.emplace(key, works.size() - 1);
    results[i].stats.n_computed = int(r.tokens.size());
  }
  Held held(store_);
  for (size_t k = 0; k < works.size(); ++k)
    for (const PlacedView& v : works[k].views) hold(v.message, held, &results[work_request[k]].stats);
  prefetch_due();  // with this batch's parents held: the loads overlap its compute
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
      place_e_cache(*w->msg);
      share(*w->msg);          // T3: written through, for other processes
      write_through(*w->msg);  // T2, when asked for
    }
  }
  if (disk_ && persist_prefills_)
    for (Work& w : works) persist(w.msg->id);
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
    for (const PlacedView& v : works[i].views) hold(v.message, held, &results[i].stats);
  prefetch_due();  // with this batch's parents held: the loads overlap its generation

  generate(requests, works, results, t0);

  const double t1 = steady_ms();
  const model::Vocab& vocab = model().vocab();  // every model of the engine has the base model's vocabulary
  for (size_t i = 0; i < n; ++i) {
    const DecodeRequest& r = requests[i];
    DecodeResult& res = results[i];
    store_.publish(*layouts[i].encoded);
    place_e_cache(*layouts[i].encoded);
    write_through(*layouts[i].encoded);
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
  for (size_t i = 0; i < n; ++i) results[i].stats.n_computed = int(works[i].msg->tokens.size());
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

// ---- KV tiers (runtime/kv/tiers.h, docs/store.md "Tiers") ------------------------------------------

void Engine::set_tiers(const kv::TierSettings& settings) {
  tiers_ = settings;
  host_.set_budget(settings.host_bytes);
  // A smaller T1 budget than what it holds now: drop copies until it fits.
  while (host_.bytes_in_use() > host_.budget_bytes() && make_host_room(host_.bytes_in_use() - host_.budget_bytes(), kv::kNoMessage)) {
  }
}

kv::TierStats Engine::tier_stats() const {
  kv::TierStats s = tier_stats_;
  s.t0_peak_bytes = store_.pool().peak_bytes();
  s.t1_peak_bytes = host_.peak_bytes();
  return s;
}

void Engine::prefetch(kv::MessageId id) {
  if (!store_.contains(id)) throw InputError(fmt::format("prefetch: unknown message {}", id));
  make_resident(store_.get(id), nullptr);
}

void Engine::hold(kv::MessageId id, Held& held, CallStats* stats) {
  kv::Message& m = store_.record(id);
  make_resident(m, stats);
  held.add(m);
}

void Engine::make_resident(kv::Message& m, CallStats* stats) {
  m.last_use = store_.tick();
  m.last_use_ms = steady_ms();
  if (m.loading) settle(m, stats);  // a prefetch in flight: wait for what is left (a failed one: see below)
  if (m.prefetched && m.resident()) {
    m.prefetched = false;
    ++tier_stats_.prefetch_used;
    if (stats) stats->n_loaded += int(m.tokens.size());
  }
  if (m.resident() || !m.complete()) return;  // in T0 already, or nothing encoded to bring back
  const double t0 = steady_ms();
  if (!m.host.empty()) {
    // T1 -> T0: a memory copy on the CPU backend. The T1 copy stays (the pages are immutable), so evicting
    // the message again costs nothing.
    // Allocating its pages may evict other messages to T1; the copy is held aside meanwhile so that making
    // room in T1 cannot drop it. Its own first pages must not make it a candidate either.
    kv::HostCopy copy = std::move(m.host);
    try {
      Held loading(store_);
      loading.add(m);
      m.pages.reserve(int(m.tokens.size()));
    } catch (...) {
      m.pages.clear();
      m.host = std::move(copy);
      throw;
    }
    const size_t n = std::min(m.pages.pages().size(), copy.n_pages());
    try {
      m.pages.upload(copy.page(0), n);
    } catch (...) {
      m.pages.clear();
      m.host = std::move(copy);
      throw;
    }
    m.host = std::move(copy);
    place_e_cache(m);
    record(kv::TierEvent::Kind::Load, 1, m, n * store_.pool().page_bytes(), t0);
    ++tier_stats_.t1_hits;
    tier_stats_.t1_load_bytes += n * store_.pool().page_bytes();
    tier_stats_.t1_load_tokens += m.tokens.size();
    if (stats) stats->n_loaded += int(m.tokens.size());
  } else if ((disk_ || remote_) && load_pages_stored(m)) {
    if (stats) stats->n_loaded += int(m.tokens.size());
  } else {
    recompute(m, stats);
  }
  const double dt = steady_ms() - t0;
  tier_stats_.load_ms += dt;
  if (stats) stats->load_ms += dt;
}

std::vector<PlacedView> Engine::hold_parents(const kv::Message& m, Held& held, CallStats* stats) {
  std::vector<PlacedView> views;
  for (const kv::PlacedParent& p : m.parents) {
    hold(p.message, held, stats);
    const kv::Message& pm = store_.record(p.message);
    const int n = p.n_tokens >= 0 ? p.n_tokens : int(pm.tokens.size());
    views.push_back({p.message, p.offset, n, p.offset - pm.start_pos});
  }
  return views;
}

void Engine::recompute(kv::Message& m, CallStats* stats) {
  // The encoding is a function of the tokens, their positions and the parents' encodings at their offsets;
  // the kernels are batch invariant, so encoding it again alone gives the bits it had.
  const double start = steady_ms();
  Held parents(store_);
  std::vector<PlacedView> views = hold_parents(m, parents, stats);
  const int n_tokens = m.n_encoded;
  m.n_encoded = 0;
  Work w{&m, std::move(views), false, {}};
  Work* wp = &w;
  try {
    if (m.variant != 0) {
      // A cross-model plan's encoding: made again from its source the same way (cross_model.cc).
      const kv::Message& src = store_.record(m.source);
      hold(m.source, parents, stats);
      CallStats scratch;
      encode_partial(m, src, models_.plan(src.model, m.model), w.views, stats ? *stats : scratch);
    } else {
      encode(std::span<Work*>(&wp, 1));
    }
  } catch (...) {
    // Back to evicted, whole: a later call recomputes it again.
    m.pages.clear();
    m.n_encoded = n_tokens;
    throw;
  }
  place_e_cache(m);
  record(kv::TierEvent::Kind::Recompute, 0, m, 0, start);
  ++tier_stats_.recomputes;
  tier_stats_.recomputed_tokens += n_tokens;
  if (stats) stats->n_recomputed += n_tokens;
}

bool Engine::load_pages_stored(kv::Message& m) {
  // Any usable entry with the message's content key, in T2 or T3: written by this engine's evictions, or by
  // another run, process or `choreo encode`. Keys cover the model, tokens, positions and parents, and the
  // tokens are checked too.
  if (m.key == 0) return false;
  const double start = steady_ms();
  std::optional<Stored> entry = open_stored(m.key, m.model);
  if (!entry || entry->meta().tokens != m.tokens || entry->meta().start_pos != m.start_pos) return false;
  bool ok = false;
  try {
    Held loading(store_);
    loading.add(m);
    ok = read_stored(*entry, m);
  } catch (...) {
    m.pages.clear();
    throw;
  }
  if (!ok) {
    m.pages.clear();
    if (entry->mapped) m.on_disk = false;
    ++(entry->mapped ? tier_stats_.t2_bad : tier_stats_.t3_bad);
    return false;
  }
  place_e_cache(m);
  const uint64_t bytes = entry->meta().n_pages() * store_.pool().page_bytes();
  record(kv::TierEvent::Kind::Load, entry->mapped ? 2 : 3, m, bytes, start);
  if (entry->mapped) {
    disk_->touch(m.key);
    ++tier_stats_.t2_hits;
    tier_stats_.t2_load_bytes += bytes;
    tier_stats_.t2_load_tokens += m.tokens.size();
  } else {
    m.in_t3 = true;
    ++tier_stats_.t3_hits;
    tier_stats_.t3_load_tokens += m.tokens.size();
  }
  return true;
}

std::optional<kv::EvictionCandidate> Engine::candidate(kv::MessageId id, const kv::Message& m) const {
  kv::EvictionCandidate c{id, std::nullopt, m.n_children > 0, m.released, m.last_use, 0};
  if (m.released) return c;
  // The running workflows' hints (`pin`, `priority`, `ttl`, `release`) and steps to execution. Another
  // model's encoding of a message is read when that message is, and kept as it is.
  const kv::MessageId as = read_as(m);
  const std::optional<kv::Retention> hint = step_oracles_.size() ? step_oracles_.retention(as) : std::nullopt;
  if (hint && hint->pin) return std::nullopt;
  if (tiers_.policy == kv::EvictionPolicy::Workflow || (hint && hint->release))
    c.steps = step_oracles_.steps_to_execution(as);
  if (hint) {
    c.priority = hint->priority;
    if (hint->ttl_ms && steady_ms() - m.last_use_ms > *hint->ttl_ms) c.released = true;  // expired
    if (hint->release && !c.steps) c.released = true;  // its workflow will not read it again
  }
  return c;
}

std::vector<kv::EvictionCandidate> Engine::eviction_order(HeldPages* held) {
  std::vector<kv::EvictionCandidate> candidates;
  for (kv::MessageId id = 0; id < store_.n_records(); ++id) {
    kv::Message* m = store_.record_or_null(id);
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
  kv::order_for_eviction(candidates, tiers_.policy);
  return candidates;
}

bool Engine::evict_one() {
  HeldPages held;
  const std::vector<kv::EvictionCandidate> candidates = eviction_order(&held);
  if (candidates.empty() && settle_one()) return true;  // a prefetch held pages: settled, it can go now
  if (candidates.empty()) {
    const kv::PagePool& pool = store_.pool();
    throw InputError(
        fmt::format("KV cache budget (T0) of {:.1f} MiB cannot hold what the running calls need: {} pages of "
                    "{:.2f} MiB are in use or pinned{}{}",
                    pool.budget_bytes() / 1048576.0, held.pages, pool.page_bytes() / 1048576.0,
                    held.messages.empty() ? "" : ", by ", fmt::join(held.messages, ", ")),
        "raise the cache budget (--cache-mib), pin fewer messages, or give the calls fewer or shorter parents");
  }
  offload(store_.record(candidates.front().id));
  return true;
}

void Engine::offload(kv::Message& m) {
  const kv::PagePool& pool = store_.pool();
  const size_t n_pages = pool.layout().pages_for(m.tokens.size());
  const size_t bytes = n_pages * pool.page_bytes();
  if (m.host.empty() && !m.released && host_room(bytes, m.id)) {
    const double start = steady_ms();
    m.host = kv::HostCopy(host_, pool.backend(), n_pages, pool.page_bytes());
    m.pages.download(n_pages, m.host.page(0));
    record(kv::TierEvent::Kind::Offload, 1, m, bytes, start);
    ++tier_stats_.t1_offloads;
    tier_stats_.t1_offload_bytes += bytes;
  } else if (m.host.empty()) {
    write_resident(m, kv::TierEvent::Kind::Offload);
  }
  m.pages.clear();
  place_e_cache(m);
  ++tier_stats_.t0_evictions;
  if (m.prefetched) {
    m.prefetched = false;
    ++tier_stats_.prefetch_wasted;
  }
}

void Engine::place_e_cache(kv::Message& m) {
  if (m.e_cache.empty()) {
    m.e_charge.reset();
    return;
  }
  const int want = m.resident() ? 0 : !m.host.empty() ? 1 : -1;
  const int had = m.e_charge.tier();
  if (want == had) return;
  const size_t bytes = e_cache_bytes(m.e_cache);
  // On the CPU backend both tiers are host memory: the rows stay where they are, and only the budget they
  // are charged to changes.
  m.e_charge.reset();
  bool placed = false;
  if (want == 0) {
    Held held(store_);  // the room made for it must not be m's own pages
    held.add(m);
    placed = m.e_charge.to_t0(store_.pool(), bytes);
  } else if (want == 1) {
    placed = host_room(bytes, m.id) && m.e_charge.to_t1(host_, bytes);
  }
  if (!placed) {
    m.e_cache.clear();
    if (!m.e_stored) {  // otherwise its T2 or T3 entry still has it
      ++tier_stats_.e_dropped;
      tier_stats_.e_dropped_bytes += bytes;
    }
  } else if (want == 1) {
    ++tier_stats_.e_t1_offloads;
    tier_stats_.e_t1_offload_bytes += bytes;
  } else if (had == 1) {
    ++tier_stats_.e_t1_loads;
    tier_stats_.e_t1_load_bytes += bytes;
  } else {
    ++tier_stats_.e_saved;
    tier_stats_.e_saved_bytes += bytes;
  }
}

std::vector<int> Engine::e_layers_for(int model, const std::optional<std::vector<int>>& read_by) const {
  return read_by ? models_.e_cache_layers(model, *read_by) : models_.e_cache_layers(model);
}

void Engine::write_through(kv::Message& m) {
  if (tiers_.write_through && m.complete() && m.resident()) write_resident(m, kv::TierEvent::Kind::Write);
}

void Engine::write_resident(kv::Message& m, kv::TierEvent::Kind kind) {
  const kv::PagePool& pool = store_.pool();
  const size_t n_pages = pool.layout().pages_for(m.tokens.size());
  if (!may_write_back(m, n_pages * pool.page_bytes())) return;  // before staging the pages for nothing
  const std::vector<std::byte> host = m.pages.to_host(n_pages);
  std::vector<const std::byte*> pages;
  for (size_t p = 0; p < n_pages; ++p) pages.push_back(host.data() + p * pool.page_bytes());
  write_back(m, std::move(pages), kind);
}

void Engine::record(kv::TierEvent::Kind kind, int tier, const kv::Message& m, uint64_t bytes, double start_ms) {
  constexpr size_t kMaxEvents = size_t(1) << 20;
  if (tier_events_.size() >= kMaxEvents) return;
  tier_events_.push_back({kind, tier, m.id, bytes, m.tokens.size(), start_ms, steady_ms()});
}

bool Engine::may_write_back(const kv::Message& m, size_t bytes) const {
  // A cross-model plan's encoding (variant) is not written: its key is not a hash of what the entry holds.
  return disk_ && !m.released && !m.on_disk && m.key != 0 && m.variant == 0 &&
         tier_stats_.t2_write_bytes + bytes <= tiers_.disk_bytes;
}

void Engine::write_back(kv::Message& m, std::vector<const std::byte*> pages, kv::TierEvent::Kind kind) {
  // Write-back to T2: the message's own entry (its ancestors stay in memory, as records at least). An entry
  // the store cannot take (its name held by a directory) leaves the message to be recomputed; a write that
  // fails (a full disk) stops T2 writes for this engine.
  const size_t bytes = pages.size() * store_.pool().page_bytes() + e_cache_bytes(m.e_cache);
  if (!may_write_back(m, bytes)) return;
  const double start = steady_ms();
  try {
    if (save_entry(m.id, 0, std::move(pages))) {
      record(kind, 2, m, bytes, start);
      m.on_disk = true;
      ++tier_stats_.t2_writes;
      tier_stats_.t2_write_bytes += bytes;
    }
  } catch (const RuntimeFailure&) {
    ++tier_stats_.t2_write_errors;
    tiers_.disk_bytes = 0;
  }
}

bool Engine::make_host_room(size_t bytes, kv::MessageId keep) {
  // Copies of messages still in T0 go first (dropping them loses nothing now), each group in policy order.
  std::vector<kv::EvictionCandidate> resident, evicted;
  for (kv::MessageId id = 0; id < store_.n_records(); ++id) {
    kv::Message* m = store_.record_or_null(id);
    if (!m || m->host.empty() || id == keep) continue;
    const std::optional<kv::EvictionCandidate> c = candidate(id, *m);
    if (!c && !m->resident()) continue;  // pinned: its only copy stays
    (m->resident() ? resident : evicted).push_back(c.value_or(kv::EvictionCandidate{id}));
  }
  kv::order_for_eviction(resident, tiers_.policy);
  kv::order_for_eviction(evicted, tiers_.policy);
  resident.insert(resident.end(), evicted.begin(), evicted.end());
  const size_t target = host_.budget_bytes() >= bytes ? host_.budget_bytes() - bytes : 0;
  for (const kv::EvictionCandidate& c : resident) {
    if (host_.bytes_in_use() <= target) break;
    kv::Message& m = store_.record(c.id);
    if (!m.resident()) {  // its last copy: down to T2 when it takes it
      std::vector<const std::byte*> pages;
      for (size_t p = 0; p < m.host.n_pages(); ++p) pages.push_back(m.host.page(p));
      write_back(m, pages);
    }
    m.host.reset();
    place_e_cache(m);
    ++tier_stats_.t1_evictions;
  }
  return host_.bytes_in_use() <= target;
}

// ---- the persistent store (docs/store.md) ----------------------------------------------------------

void Engine::set_remote_store(store::RedisStore* remote) { remote_ = remote; }

void Engine::set_disk_store(store::DiskStore* disk, bool persist_prefills) {
  disk_ = disk;
  persist_prefills_ = persist_prefills;
}

std::vector<kv::MessageId> Engine::unstored_ancestry(kv::MessageId id) {
  // Depth-first, children after their parents (post-order), each message once however many paths reach it.
  // An ancestor the store holds a usable entry for ends the walk there: its own ancestors were stored with
  // it.
  std::vector<kv::MessageId> order;
  std::unordered_set<kv::MessageId> seen{id};
  std::vector<std::pair<kv::MessageId, size_t>> stack{{id, 0}};  // (message, next parent to visit)
  while (!stack.empty()) {
    auto& [message, next] = stack.back();
    const kv::Message& m = store_.get(message);
    if (next == m.parents.size()) {
      order.push_back(message);
      stack.pop_back();
      continue;
    }
    const kv::MessageId parent = m.parents[next++].message;
    if (!store_.contains(parent))
      throw InputError(
          fmt::format("persist: message {} was encoded over message {}, which was released", message, parent),
          "persist a message before releasing its parents");
    if (is_bos(parent) || !seen.insert(parent).second) continue;
    const kv::Message& p = store_.get(parent);
    if (!disk_->open(p.key, {models_[size_t(p.model)].fingerprint, store_.pool().layout()}))
      stack.push_back({parent, 0});
  }
  return order;
}

store::EntryMeta Engine::entry_meta(const kv::Message& m, uint64_t tag) const {
  store::EntryMeta meta;
  for (const kv::PlacedParent& p : m.parents) meta.parents.push_back({store_.record(p.message).key, p.offset});
  const EngineModel& model = models_[size_t(m.model)];
  meta.model_fingerprint = model.fingerprint;
  meta.content_key = m.key;
  meta.tag = tag;
  meta.model_name = std::filesystem::path(model.weights->file().path()).filename().string();
  meta.tokens = m.tokens;
  meta.start_pos = m.start_pos;
  meta.agent = m.agent;
  meta.visibility = uint32_t(m.visibility);
  meta.layout = store_.pool().layout();
  // The E caches it holds for every token (a plan's sender reads them back with the pages).
  const size_t dim = size_t(model.weights->config().dim);
  for (const auto& [layer, rows] : m.e_cache)
    if (rows.size() == m.tokens.size() * dim) meta.e_layers.push_back(uint32_t(layer));
  if (!meta.e_layers.empty()) meta.e_dim = uint32_t(dim);
  return meta;
}

bool Engine::save_entry(kv::MessageId id, uint64_t tag, std::vector<const std::byte*> pages) {
  Held held(store_);
  if (pages.empty()) hold(id, held, nullptr);  // its T0 pages, brought back first if need be
  const kv::Message& m = store_.get(id);
  const store::EntryMeta meta = entry_meta(m, tag);
  std::vector<std::byte> host;
  if (pages.empty()) {
    // A decode may hold a spare page beyond its last token: only the entry's pages are written.
    host = m.pages.to_host(meta.n_pages());
    for (size_t p = 0; p < meta.n_pages(); ++p) pages.push_back(host.data() + p * meta.page_bytes());
  }
  pages.resize(meta.n_pages());
  if (!disk_->save(meta, pages, e_section_spans(m, meta))) return false;
  if (!meta.e_layers.empty()) {
    store_.record(id).e_stored = true;
    ++tier_stats_.e_t2_writes;
    tier_stats_.e_t2_write_bytes += meta.e_layers.size() * meta.e_section_bytes();
  }
  return true;
}

void Engine::share(kv::Message& m) {
  if (!remote_ || !remote_->usable() || m.key == 0 || !m.resident()) return;
  const double start = steady_ms();
  const store::EntryMeta meta = entry_meta(m, 0);
  const std::vector<std::byte> host = m.pages.to_host(meta.n_pages());
  std::vector<std::span<const uint8_t>> body;  // the pages, then the E caches
  for (size_t i = 0; i < meta.n_pages(); ++i)
    body.push_back({reinterpret_cast<const uint8_t*>(host.data()) + i * meta.page_bytes(), meta.page_bytes()});
  for (std::span<const uint8_t> e : e_section_spans(m, meta)) body.push_back(e);
  const std::vector<uint8_t> entry = store::encode_entry(meta, body);
  if (remote_->put(m.key, entry)) {
    m.in_t3 = true;
    if (!meta.e_layers.empty()) {
      m.e_stored = true;
      ++tier_stats_.e_t3_writes;
      tier_stats_.e_t3_write_bytes += meta.e_layers.size() * meta.e_section_bytes();
    }
    record(kv::TierEvent::Kind::Write, 3, m, entry.size(), start);
    ++tier_stats_.t3_writes;
    tier_stats_.t3_write_bytes += entry.size();
  }
}

void Engine::persist(kv::MessageId id, uint64_t tag) {
  if (!disk_) throw InputError("persist: no persistent store is set", "give a cache directory");
  if (!store_.contains(id)) throw InputError(fmt::format("persist: unknown message {}", id));
  const kv::Message& m = store_.get(id);
  if (m.key == 0 || m.tokens.empty() || m.n_encoded != int(m.tokens.size()) || m.pages.pages().empty())
    throw InputError(fmt::format("persist: message {} has no complete encoding", id),
                     "only messages encoded in choreo mode can be persisted");
  if (is_bos(id)) return;  // every engine encodes its own BOS
  // The message itself is always written; an ancestor only when the store has no usable entry for it.
  std::vector<kv::MessageId> to_write = unstored_ancestry(id);  // parents first, ends with `id`
  const size_t n_written = to_write.size();
  // Another process may delete entries meanwhile (`cache gc`, `cache rm`): whatever it took of what this call
  // wrote is written again, each message at most once per attempt, for a bounded number of attempts.
  constexpr int kMaxAttempts = 3;
  std::unordered_set<kv::MessageId> unwritable;  // a directory holds the entry's name (save reported it)
  for (int attempt = 1;; ++attempt) {
    for (kv::MessageId a : to_write)
      if (!save_entry(a, tag)) unwritable.insert(a);
    std::erase_if(to_write, [&](kv::MessageId a) {
      return unwritable.contains(a) || disk_->has_file(store_.get(a).key);
    });
    if (to_write.empty()) return;
    if (attempt == kMaxAttempts)
      throw RuntimeFailure(fmt::format(
          "persist: the store {} keeps losing entries: {} of the {} entries written for message {} were gone "
          "again after {} attempts (is another process removing them, e.g. `choreo cache gc` or `rm`?)",
          disk_->dir(), to_write.size(), n_written, id, kMaxAttempts));
  }
}

std::optional<kv::MessageId> Engine::load(uint64_t key, int model) {
  check_model(model, "load", 0);
  if (kv::Message* m = store_.find(key)) return m->id;  // keys cover the model: this is its encoding
  if ((!disk_ && !remote_) || !call_mode_->encodes_prefills()) return std::nullopt;
  return load_stored(key, 0, model);
}

std::optional<Engine::Stored> Engine::open_stored(uint64_t key, int model) {
  const store::Compatibility expect{models_[size_t(model)].fingerprint, store_.pool().layout()};
  Stored s;
  if (disk_) s.mapped = disk_->open(key, expect);
  if (s.mapped) return s;
  if (!remote_ || !remote_->usable()) return std::nullopt;
  std::optional<std::vector<uint8_t>> bytes = remote_->get(key);
  if (!bytes) return std::nullopt;
  s.bytes = std::move(*bytes);
  s.parsed = store::parse_entry_for(s.bytes, key, expect);
  if (s.parsed.problem != store::EntryProblem::Ok) {
    remote_->report_bad(key, store::describe(s.parsed.problem));
    ++tier_stats_.t3_bad;
    return std::nullopt;
  }
  return s;
}

void Engine::report_stored(const Stored& s, uint64_t key, std::string_view what) {
  ++(s.mapped ? tier_stats_.t2_bad : tier_stats_.t3_bad);
  if (s.mapped)
    disk_->report_unusable(key, what);
  else
    remote_->report_bad(key, what);
}

bool Engine::read_stored(const Stored& s, kv::Message& m) {
  if (s.mapped) {
    if (!disk_->read_pages(*s.mapped, m.pages)) return false;  // checks every page and E cache first
  } else if (const std::optional<std::string> bad = store::copy_checked_pages(s.bytes, s.parsed, m.pages)) {
    remote_->report_bad(s.parsed.meta.content_key, *bad);
    return false;
  }
  if (!s.meta().e_layers.empty()) m.e_stored = true;
  take_e_cache(m, store::e_sections(s.file(), s.entry(), m.e_layers), s.tier());
  return true;
}

bool Engine::accept_e_cache(const kv::Message& m, std::map<int, std::vector<float>>& e_cache, int tier) {
  const size_t rows = m.tokens.size() * size_t(models_[size_t(m.model)].weights->config().dim);
  std::erase_if(e_cache, [&](const auto& layer) { return layer.second.size() != rows; });
  if (e_cache.empty()) return false;
  const size_t bytes = e_cache_bytes(e_cache);
  ++(tier == 2 ? tier_stats_.e_t2_loads : tier_stats_.e_t3_loads);
  (tier == 2 ? tier_stats_.e_t2_load_bytes : tier_stats_.e_t3_load_bytes) += bytes;
  return true;
}

void Engine::take_e_cache(kv::Message& m, std::map<int, std::vector<float>> e_cache, int tier) {
  if (!m.e_cache.empty() || !accept_e_cache(m, e_cache, tier)) return;
  m.e_cache = std::move(e_cache);
  m.e_stored = true;
}

std::map<int, std::vector<float>> Engine::stored_e_cache(const kv::Message& m, std::span<const int> layers) {
  if (!m.e_stored || m.key == 0 || m.variant != 0) return {};
  std::optional<Stored> entry = open_stored(m.key, m.model);
  if (!entry || entry->meta().tokens != m.tokens || entry->meta().start_pos != m.start_pos) return {};
  const store::ParsedEntry& parsed = entry->entry();
  std::vector<int> found;
  for (size_t j = 0; j < parsed.meta.e_layers.size(); ++j) {
    const int layer = int(parsed.meta.e_layers[j]);
    if (std::find(layers.begin(), layers.end(), layer) == layers.end()) continue;
    if (!store::e_section_intact(entry->file(), parsed, j)) {
      report_stored(*entry, m.key,
                    fmt::format("{} (layer {})", store::describe(store::EntryProblem::ECacheChecksum), layer));
      return {};
    }
    found.push_back(layer);
  }
  std::map<int, std::vector<float>> out = store::e_sections(entry->file(), parsed, found);
  if (!accept_e_cache(m, out, entry->tier())) return out;
  if (entry->mapped) disk_->touch(m.key);
  return out;
}

std::optional<kv::MessageId> Engine::load_stored(uint64_t key, int depth, int model) {
  if (kv::Message* m = store_.find(key)) return m->id;  // keys cover the model: this is its encoding
  // Keys hash their parents' keys, so real ancestries are acyclic; the bound stops a crafted cycle.
  constexpr int kMaxAncestry = 4096;
  std::optional<Stored> entry = open_stored(key, model);
  if (!entry) return std::nullopt;
  if (depth > kMaxAncestry) {
    report_stored(*entry, key, "ancestry deeper than 4096 messages");
    return std::nullopt;
  }
  const store::EntryMeta& meta = entry->meta();
  if (meta.start_pos + int64_t(meta.tokens.size()) > n_ctx_ ||
      std::any_of(meta.tokens.begin(), meta.tokens.end(),
                  [&](model::Token t) { return t < 0 || t >= models_.base().weights->config().n_vocab; })) {
    report_stored(*entry, key, "tokens or positions outside this model's range");
    return std::nullopt;
  }
  std::vector<kv::PlacedParent> parents;
  for (const store::EntryParent& p : meta.parents) {
    std::optional<kv::MessageId> parent = load_stored(p.key, depth + 1, model);
    if (!parent || p.offset < 0 || p.offset > n_ctx_) return std::nullopt;
    parents.push_back({*parent, int(p.offset)});
  }
  if (store_.content_key(meta.tokens, meta.start_pos, parents, model) != key) {
    report_stored(*entry, key, "its tokens and parents do not hash to its content key");
    return std::nullopt;
  }
  const double start = steady_ms();
  kv::Message& m = store_.create();
  m.model = model;
  m.tokens = meta.tokens;
  m.start_pos = meta.start_pos;
  m.parents = std::move(parents);
  m.agent = meta.agent;
  m.visibility =
      meta.visibility == uint32_t(kv::Visibility::Private) ? kv::Visibility::Private : kv::Visibility::Public;
  // Its E caches stay in the entry (e_stored): a plan that needs them reads them from there.
  if (!read_stored(*entry, m)) {
    ++(entry->mapped ? tier_stats_.t2_bad : tier_stats_.t3_bad);
    store_.erase(m.id);
    return std::nullopt;
  }
  m.n_encoded = int(m.tokens.size());
  m.on_disk = entry->mapped.has_value();
  store_.publish(m);
  record(kv::TierEvent::Kind::Load, entry->mapped ? 2 : 3, m, meta.n_pages() * meta.page_bytes(), start);
  if (entry->mapped) {
    disk_->touch(key);
  } else {
    m.in_t3 = true;
    ++tier_stats_.t3_hits;
    tier_stats_.t3_load_tokens += m.tokens.size();
  }
  return m.id;
}

}  // namespace choreo::runtime
