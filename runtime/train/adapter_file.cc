#include "runtime/train/adapter_file.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/model/gguf.h"

namespace choreo::train {

namespace {

constexpr const char* kTensorNames[kLayerTargets] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                     "ffn_gate", "ffn_up", "ffn_down"};

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

void write_adapter(const model::Model& base, const LoraParams<float>& lora, const std::string& path,
                   const std::string& name) {
  gguf::Writer w;
  w.set_string("general.architecture", base.config().architecture);
  w.set_string("general.type", "adapter");
  w.set_string("general.name", name);
  w.set_string("adapter.type", "lora");
  w.set_f32("adapter.lora.alpha", lora.alpha);
  const auto add = [&](const std::string& weight, const LoraParams<float>::Pair& p) {
    w.add_tensor(weight + ".lora_a", {p.n_in, lora.rank}, kernels::DType::F32, bytes_of(p.a));
    w.add_tensor(weight + ".lora_b", {lora.rank, p.n_out}, kernels::DType::F32, bytes_of(p.b));
  };
  for (size_t l = 0; l < lora.layers.size(); ++l)
    for (int t = 0; t < kLayerTargets; ++t)
      if (const auto& p = lora.layers[l][size_t(t)]) add(fmt::format("blk.{}.{}.weight", l, kTensorNames[t]), *p);
  if (lora.output) {
    if (base.config().tied_output)
      throw InputError(fmt::format("{} ties its output projection to its token embeddings: an adapter cannot "
                                   "target output",
                                   base.file().path()),
                       "leave output out of --targets");
    add("output.weight", *lora.output);
  }
  w.write(path);
}

}  // namespace choreo::train
