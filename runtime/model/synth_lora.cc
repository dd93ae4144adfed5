#include "runtime/model/synth_lora.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "common/error.h"
#include "runtime/model/gguf.h"
#include "runtime/model/llama.h"
#include "runtime/model/synth.h"

namespace choreo::model {

namespace {

constexpr std::string_view kTargetNames[] = {"q", "k", "v", "o", "gate", "up", "down"};
constexpr std::string_view kTensorNames[] = {"attn_q", "attn_k",  "attn_v",  "attn_output",
                                             "ffn_gate", "ffn_up", "ffn_down"};

/// `rows` rows of `row_elements` F32 values, each row N(0, stddev) from its own seed.
std::vector<uint8_t> random_f32(uint64_t seed, int64_t row_elements, int64_t rows, float stddev) {
  std::vector<uint8_t> bytes(size_t(row_elements * rows) * sizeof(float));
  std::vector<float> row(static_cast<size_t>(row_elements));
  for (int64_t r = 0; r < rows; ++r) {
    random_normal_row(mix64(seed ^ mix64(uint64_t(r))), 0.0f, stddev, row);
    std::memcpy(bytes.data() + size_t(r * row_elements) * sizeof(float), row.data(), row.size() * sizeof(float));
  }
  return bytes;
}

}  // namespace

std::pair<int, int> parse_layer_range(const std::string& text, std::string_view flag, int n_layers) {
  const auto bad = [&] {
    return InputError(fmt::format("{} '{}' is not FIRST-LAST or one layer", flag, text),
                      fmt::format("e.g. {} 10-14 (both included)", flag));
  };
  const auto number = [&](std::string_view part) {
    int v = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || v < 0) throw bad();
    return v;
  };
  const std::string_view all = text;
  const size_t dash = all.find('-');
  const int first = number(all.substr(0, dash));
  const int last = dash == std::string_view::npos ? first : number(all.substr(dash + 1));
  if (last < first) throw bad();
  if (n_layers > 0 && last >= n_layers)
    throw InputError(fmt::format("{} {}: the model has layers 0-{}", flag, text, n_layers - 1));
  return {first, last + 1};
}

std::vector<LoraTarget> parse_lora_targets(const std::string& list) {
  std::vector<LoraTarget> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    bool found = false;
    for (size_t t = 0; t < std::size(kTargetNames); ++t)
      if (name == kTargetNames[t]) {
        if (std::find(out.begin(), out.end(), LoraTarget(t)) == out.end()) out.push_back(LoraTarget(t));
        found = true;
      }
    if (!found)
      throw InputError(fmt::format("'{}' is not a projection an adapter can target", name),
                       "use a comma-separated subset of q,k,v,o,gate,up,down");
    start = comma + 1;
  }
  return out;
}

void write_synthetic_lora(const Model& base, const SynthLoraSpec& spec, const std::string& path) {
  const LlamaConfig& c = base.config();
  const int end = spec.end_layer < 0 ? c.n_layers : spec.end_layer;
  if (spec.first_layer < 0 || spec.first_layer >= end || end > c.n_layers)
    throw InputError(fmt::format("layers [{}, {}) are not a non-empty range of the model's {} layers",
                                 spec.first_layer, end, c.n_layers),
                     fmt::format("the model's layers are 0 to {}", c.n_layers - 1));
  if (spec.targets.empty()) throw InputError("a synthetic adapter needs at least one target", "e.g. q,k,v,o");
  if (!(spec.strength >= 0.0f) || !std::isfinite(spec.strength) || !std::isfinite(spec.alpha) || spec.alpha < 0.0f)
    throw InputError("the adapter's strength and alpha must be finite and not negative");
  gguf::Writer w;
  w.set_string("general.architecture", c.architecture);
  w.set_string("general.type", "adapter");
  w.set_string("general.name", "choreo synthetic LoRA");
  w.set_string("adapter.type", "lora");
  w.set_f32("adapter.lora.alpha", spec.alpha);
  for (int l = spec.first_layer; l < end; ++l)
    for (LoraTarget t : spec.targets) {
      const std::string name = fmt::format("blk.{}.{}.weight", l, kTensorNames[int(t)]);
      const gguf::TensorInfo* info = base.file().tensor(name);
      if (!info || info->shape.size() != 2) throw InputError(fmt::format("{}: the base model has no {}", base.file().path(), name));
      const int64_t n_in = info->shape[0], n_out = info->shape[1];
      if (spec.rank < 1 || spec.rank > std::min(n_in, n_out))
        throw InputError(fmt::format("rank {} does not fit {} ({} x {})", spec.rank, name, n_in, n_out),
                         fmt::format("give a rank from 1 to {}", std::min(n_in, n_out)));
      const uint64_t seed = mix64(spec.seed ^ XXH3_64bits(name.data(), name.size()));
      w.add_tensor(name + ".lora_a", {n_in, spec.rank}, kernels::DType::F32,
                   random_f32(seed, n_in, spec.rank, 1.0f / std::sqrt(float(n_in))));
      w.add_tensor(name + ".lora_b", {spec.rank, n_out}, kernels::DType::F32,
                   random_f32(mix64(seed + 1), spec.rank, n_out, spec.strength));
    }
  w.write(path);
}

}  // namespace choreo::model
