#include "runtime/engine/model_set.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <xxhash.h>

#include "common/error.h"

namespace choreo::runtime {

namespace {

std::string file_name(const model::Model& m) { return std::filesystem::path(m.file().path()).filename().string(); }

/// What makes `other` unusable beside `base` in one engine (its KV pages, tokens and logits must mean the
/// same), or empty.
std::string difference(const model::Model& base, const model::Model& other) {
  const model::LlamaConfig& a = base.config();
  const model::LlamaConfig& b = other.config();
  if (a.architecture != b.architecture)
    return fmt::format("architecture {} instead of {}", b.architecture, a.architecture);
  const std::pair<const char*, std::pair<int, int>> shape[] = {
      {"layers", {a.n_layers, b.n_layers}},   {"embedding size", {a.dim, b.dim}},
      {"heads", {a.n_heads, b.n_heads}},      {"KV heads", {a.n_kv_heads, b.n_kv_heads}},
      {"head size", {a.head_dim, b.head_dim}}, {"feed-forward size", {a.ffn_dim, b.ffn_dim}},
      {"vocabulary size", {a.n_vocab, b.n_vocab}},
  };
  for (const auto& [what, values] : shape)
    if (values.first != values.second) return fmt::format("{} {} instead of {}", values.second, what, values.first);
  const model::Vocab& va = base.vocab();
  const model::Vocab& vb = other.vocab();
  if (va.kind() != vb.kind() || va.bos() != vb.bos() || va.eos() != vb.eos() || va.add_bos() != vb.add_bos())
    return "another tokenizer (type or special tokens)";
  for (model::Token t = 0; t < va.n_tokens(); ++t)
    if (va.token_to_piece(t, true) != vb.token_to_piece(t, true))
      return fmt::format("another vocabulary (token {} differs)", t);
  return {};
}

}  // namespace

uint64_t weights_fingerprint(const model::Model& weights, const model::LoraStack& lora) {
  if (lora.empty()) return weights.fingerprint();
  const uint64_t words[2] = {weights.fingerprint(), lora.fingerprint()};
  return XXH3_64bits(words, sizeof words);
}

std::string EngineModel::describe() const {
  std::string out = fmt::format("{} ({}", name, file_name(*weights));
  for (const auto& [adapter, scale] : lora.adapters)
    out += fmt::format(" + {} x {}", std::filesystem::path(adapter->path()).filename().string(), scale);
  return out + ")";
}

ModelSet::ModelSet(const model::Model& base, model::LoraStack lora, std::string name) {
  models_.push_back({std::move(name), &base, lora, weights_fingerprint(base, lora)});
}

int ModelSet::add(std::string name, const model::Model& weights, model::LoraStack lora) {
  if (name.empty()) throw InputError("a model needs a name", "give each model of a run its own name");
  if (find(name))
    throw InputError(fmt::format("two models are called '{}'", name), "give each model of a run its own name");
  if (&weights != base().weights) {
    if (const std::string why = difference(*base().weights, weights); !why.empty())
      throw InputError(fmt::format("model '{}': {} cannot run beside {}: it has {}", name, weights.file().path(),
                                   base().weights->file().path(), why),
                       "the models of one run must share the base model's architecture, shapes and vocabulary "
                       "(fine-tuned siblings, or adapters over it)");
  }
  models_.push_back({std::move(name), &weights, std::move(lora), 0});
  models_.back().fingerprint = weights_fingerprint(weights, models_.back().lora);
  return int(models_.size()) - 1;
}

std::optional<int> ModelSet::find(std::string_view name) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].name == name) return int(i);
  return std::nullopt;
}

std::string_view CrossModelPlan::kind_name(Kind kind) {
  switch (kind) {
    case Kind::Recompute: return "recompute";
    case Kind::Reuse: return "reuse";
    case Kind::Partial: return "partial";
  }
  return "?";
}

std::optional<CrossModelPlan::Kind> CrossModelPlan::parse_kind(std::string_view name) {
  for (Kind k : {Kind::Recompute, Kind::Reuse, Kind::Partial})
    if (kind_name(k) == name) return k;
  return std::nullopt;
}

std::string CrossModelPlan::describe() const {
  std::string out(kind_name(kind));
  if (kind != Kind::Partial) return out;
  for (const LayerRange& r : ranges) out += fmt::format(" [{}, {})", r.begin, r.end);
  return ranges.empty() ? out + " []" : out;
}

uint64_t CrossModelPlan::fingerprint() const {
  if (kind == Kind::Recompute) return 0;
  std::vector<int64_t> words{int64_t(kind)};
  for (const LayerRange& r : ranges) words.insert(words.end(), {r.begin, r.end});
  return XXH3_64bits(words.data(), sizeof(int64_t) * words.size());
}

int CrossModelPlan::recomputed_layers(int n_layers) const {
  switch (kind) {
    case Kind::Recompute: return n_layers;
    case Kind::Reuse: return 0;
    case Kind::Partial: break;
  }
  int n = 0;
  for (const LayerRange& r : ranges) n += r.end - r.begin;
  return n;
}

void ModelSet::set_plan(int sender, int receiver, CrossModelPlan plan) {
  const auto valid = [&](int i) { return i >= 0 && size_t(i) < models_.size(); };
  if (!valid(sender) || !valid(receiver))
    throw InputError(fmt::format("a cross-model plan names model {} -> {}; there are {} models", sender, receiver,
                                 models_.size()));
  const int n_layers = models_.front().weights->config().n_layers;
  const std::string pair = fmt::format("{} reading {}", models_[size_t(receiver)].name, models_[size_t(sender)].name);
  if (plan.kind == CrossModelPlan::Kind::Partial) {
    int previous_end = 0;
    for (const LayerRange& r : plan.ranges) {
      if (r.begin < 0 || r.end > n_layers || r.begin > r.end)
        throw InputError(fmt::format("plan {} for {}: the layers must lie in [0, {}] with the first at most the last",
                                     plan.describe(), pair, n_layers),
                         fmt::format("the models have {} layers (0 to {})", n_layers, n_layers - 1));
      if (r.begin < previous_end)
        throw InputError(fmt::format("plan {} for {}: its layer ranges overlap or are out of order", plan.describe(),
                                     pair),
                         "list the recomputed ranges in ascending order, each starting at or after the last's end");
      previous_end = r.end;
    }
  } else {
    plan.ranges.clear();
  }
  if (plans_.size() <= size_t(sender)) plans_.resize(size_t(sender) + 1);
  if (plans_[size_t(sender)].size() <= size_t(receiver)) plans_[size_t(sender)].resize(size_t(receiver) + 1);
  plans_[size_t(sender)][size_t(receiver)] = std::move(plan);
}

const CrossModelPlan& ModelSet::plan(int sender, int receiver) const {
  static const CrossModelPlan recompute;
  if (size_t(sender) >= plans_.size() || size_t(receiver) >= plans_[size_t(sender)].size()) return recompute;
  return plans_[size_t(sender)][size_t(receiver)];
}

void ModelSet::save_e_caches(int sender, std::vector<int> layers) {
  const int n_layers = models_.front().weights->config().n_layers;
  for (int l : layers)
    if (l < 0 || l > n_layers)
      throw InputError(fmt::format("an E cache at layer {}: the models have layers 0 to {}", l, n_layers - 1));
  if (saved_e_caches_.size() <= size_t(sender)) saved_e_caches_.resize(size_t(sender) + 1);
  saved_e_caches_[size_t(sender)] = std::move(layers);
}

std::vector<int> ModelSet::e_cache_layers(int sender) const {
  std::vector<int> every;
  for (size_t r = 0; size_t(sender) < plans_.size() && r < plans_[size_t(sender)].size(); ++r) every.push_back(int(r));
  return e_cache_layers(sender, every);
}

std::vector<int> ModelSet::e_cache_layers(int sender, std::span<const int> readers) const {
  std::vector<int> out;
  if (size_t(sender) < saved_e_caches_.size()) out = saved_e_caches_[size_t(sender)];
  for (int receiver : readers) {
    if (receiver < 0 || size_t(receiver) >= models_.size() ||
        models_[size_t(receiver)].fingerprint == models_[size_t(sender)].fingerprint)
      continue;
    const CrossModelPlan& p = plan(sender, receiver);
    if (p.kind == CrossModelPlan::Kind::Partial)
      for (const LayerRange& r : p.ranges)
        if (r.begin < r.end) out.push_back(r.begin);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int ModelSet::n_ctx() const {
  int n = models_.front().weights->config().n_ctx_train;
  for (const EngineModel& m : models_) n = std::min(n, m.weights->config().n_ctx_train);
  return n;
}

}  // namespace choreo::runtime
