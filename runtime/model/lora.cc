#include "runtime/model/lora.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>

#include <xxhash.h>

#include "common/error.h"
#include "runtime/model/llama.h"

namespace choreo::model {

namespace {

constexpr std::string_view kLayerTensors[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                              "ffn_down"};

/// The (layer, target) of a base tensor name, or nullopt when it names no weight choreo adapts.
std::optional<std::pair<int, LoraTarget>> parse_base_tensor(std::string_view name) {
  if (name == "output.weight") return std::pair{-1, LoraTarget::Output};
  constexpr std::string_view kBlk = "blk.", kWeight = ".weight";
  if (!name.starts_with(kBlk) || !name.ends_with(kWeight)) return std::nullopt;
  name.remove_prefix(kBlk.size());
  name.remove_suffix(kWeight.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  int layer = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + dot, layer);
  if (ec != std::errc() || end != name.data() + dot || layer < 0) return std::nullopt;
  const std::string_view what = name.substr(dot + 1);
  for (int t = 0; t < int(std::size(kLayerTensors)); ++t)
    if (what == kLayerTensors[t]) return std::pair{layer, LoraTarget(t)};
  return std::nullopt;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return "[" + s + "]";
}

}  // namespace

std::shared_ptr<const LoraAdapter> LoraAdapter::load(const std::string& path, const Model& base) {
  return load(gguf::File::open(path), base);
}

std::shared_ptr<const LoraAdapter> LoraAdapter::load(gguf::File file, const Model& base) {
  std::shared_ptr<LoraAdapter> ad(new LoraAdapter(std::move(file)));
  const gguf::File& f = ad->file_;
  const std::string& path = f.path();
  const std::string hint = "--lora takes a LoRA adapter in llama.cpp's GGUF format for this base model "
                           "(convert_lora_to_gguf.py writes one); the base model goes to -m";
  const std::string type = f.get_string("general.type", "");
  if (type != "adapter")
    throw InputError(fmt::format("{}: not a LoRA adapter: general.type is '{}', expected 'adapter'", path, type), hint);
  const std::string adapter_type = f.get_string("adapter.type", "");
  if (adapter_type != "lora")
    throw InputError(fmt::format("{}: adapter.type is '{}'; choreo applies 'lora' adapters only", path, adapter_type),
                     hint);
  const LlamaConfig& c = base.config();
  const std::string arch = f.get_string("general.architecture", "");
  if (arch != c.architecture)
    throw InputError(fmt::format("{}: an adapter for architecture '{}', but the base model {} is '{}'", path, arch,
                                 base.file().path(), c.architecture),
                     hint);
  if (const gguf::Value* a = f.find("adapter.lora.alpha")) {
    if (gguf::is_integer_type(a->type))
      ad->alpha_ = float(f.get_int("adapter.lora.alpha", 0));
    else
      ad->alpha_ = float(f.get_float("adapter.lora.alpha", 0.0));
    if (!(ad->alpha_ >= 0.0f) || ad->alpha_ > 1e6f)
      throw InputError(fmt::format("{}: adapter.lora.alpha = {} is out of range (0 to 1e6)", path, ad->alpha_), hint);
  }

  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  // {n_in, n_out} of each target, as Model::load_weights checks the base tensors.
  const auto base_shape = [&](LoraTarget t) -> std::pair<int64_t, int64_t> {
    switch (t) {
      case LoraTarget::Q: return {c.dim, q_dim};
      case LoraTarget::K:
      case LoraTarget::V: return {c.dim, kv_dim};
      case LoraTarget::O: return {q_dim, c.dim};
      case LoraTarget::Gate:
      case LoraTarget::Up: return {c.dim, c.ffn_dim};
      case LoraTarget::Down: return {c.ffn_dim, c.dim};
      case LoraTarget::Output: return {c.dim, c.n_vocab};
    }
    return {0, 0};
  };
  const auto view = [&](const gguf::TensorInfo& t, int64_t n_in, int64_t n_out) {
    return base.backend().upload_weight(weight_view(f, t.name, n_in, n_out));
  };

  ad->layers_.resize(size_t(c.n_layers));
  for (const gguf::TensorInfo& t : f.tensors()) {
    const std::string_view name = t.name;
    const bool is_a = name.ends_with(".lora_a"), is_b = name.ends_with(".lora_b");
    if (!is_a && !is_b)
      throw InputError(fmt::format("{}: tensor '{}' is not a LoRA tensor (its name should end in .lora_a or .lora_b)",
                                   path, t.name),
                       hint);
    const std::string base_name(name.substr(0, name.size() - 7));
    if (!is_a) {
      if (!f.tensor(base_name + ".lora_a"))
        throw InputError(fmt::format("{}: tensor '{}' has no partner '{}.lora_a'", path, t.name, base_name), hint);
      continue;  // each pair is read once, from its lora_a
    }
    const gguf::TensorInfo* tb = f.tensor(base_name + ".lora_b");
    if (!tb) throw InputError(fmt::format("{}: tensor '{}' has no partner '{}.lora_b'", path, t.name, base_name), hint);
    const std::optional<std::pair<int, LoraTarget>> target = parse_base_tensor(base_name);
    if (!target)
      throw InputError(fmt::format("{}: tensor '{}' adapts '{}', which choreo does not adapt", path, t.name, base_name),
                       "choreo applies LoRA to attn_q/k/v/output, ffn_gate/up/down and output.weight");
    const auto [layer, which] = *target;
    if (layer >= c.n_layers)
      throw InputError(fmt::format("{}: tensor '{}' adapts layer {}, but the base model {} has {} layers", path, t.name,
                                   layer, base.file().path(), c.n_layers),
                       hint);
    if (which == LoraTarget::Output && c.tied_output)
      throw InputError(fmt::format("{}: tensor '{}' adapts output.weight, but the base model {} ties its output to "
                                   "the token embeddings",
                                   path, t.name, base.file().path()),
                       hint);
    const auto [n_in, n_out] = base_shape(which);
    if (t.shape.size() != 2 || tb->shape.size() != 2 || t.shape[0] != n_in || t.shape[1] < 1 ||
        tb->shape[0] != t.shape[1] || tb->shape[1] != n_out)
      throw InputError(fmt::format("{}: tensors '{}' {} and '{}' {} do not fit base tensor '{}' [{}, {}]: expected "
                                   "[{}, rank] and [rank, {}] with the same rank >= 1",
                                   path, t.name, shape_text(t.shape), tb->name, shape_text(tb->shape), base_name, n_in,
                                   n_out, n_in, n_out),
                       hint);
    LoraPair p;
    const int64_t rank = t.shape[1];
    if (rank > (1 << 16))
      throw InputError(fmt::format("{}: tensor '{}' has rank {}, implausibly large", path, t.name, rank), hint);
    p.a = view(t, n_in, rank);
    p.b = view(*tb, rank, n_out);
    p.alpha = ad->alpha_;
    ad->max_rank_ = std::max(ad->max_rank_, int(rank));
    ++ad->n_pairs_;
    if (which == LoraTarget::Output)
      ad->output_ = std::move(p);
    else
      ad->layers_[size_t(layer)][size_t(which)] = std::move(p);
  }
  if (ad->n_pairs_ == 0) throw InputError(fmt::format("{}: the adapter has no LoRA tensors", path), hint);
  const std::span<const uint8_t> bytes = f.bytes();
  ad->fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
  return ad;
}

const LoraPair* LoraAdapter::find(int layer, LoraTarget t) const {
  if (t == LoraTarget::Output) return output_ ? &*output_ : nullptr;
  if (layer < 0 || size_t(layer) >= layers_.size()) return nullptr;
  const std::optional<LoraPair>& p = layers_[size_t(layer)][size_t(t)];
  return p ? &*p : nullptr;
}

uint64_t LoraStack::fingerprint() const {
  if (adapters.empty()) return 0;
  std::vector<uint64_t> words;
  for (const auto& [adapter, scale] : adapters) {
    words.push_back(adapter->fingerprint());
    words.push_back(std::bit_cast<uint32_t>(scale));
  }
  return XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
}

}  // namespace choreo::model
