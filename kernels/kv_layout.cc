// KV page layout (kernels/backend.h): encoding and decoding one token's rows in host memory, and the cache
// types choreo stores (llama.cpp's -ctk/-ctv: f32, f16, q8_0).

#include <cstring>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/quant.h"

namespace choreo::kernels {

namespace {

bool storable(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::Q8_0; }

}  // namespace

std::string_view kv_type_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::Q8_0: return "q8_0";
    default: return type_traits(t).name;
  }
}

DType parse_kv_type(std::string_view name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "q8_0") return DType::Q8_0;
  throw InputError(fmt::format("unknown KV cache type '{}'; expected f32, f16 or q8_0", name),
                   "f32 is the exact reference; f16 halves the cache, q8_0 takes about a quarter of it");
}

void KvLayout::check() const {
  for (DType t : {k_type, v_type}) {
    if (!storable(t))
      throw InputError(fmt::format("KV cache type {} cannot be stored; expected f32, f16 or q8_0", kv_type_name(t)));
    const uint32_t block = type_traits(t).block_elems;
    if (head_dim % int(block) != 0)
      throw InputError(fmt::format("KV cache type {} stores blocks of {} values, and this model's heads have {}",
                                   kv_type_name(t), block, head_dim),
                       "use f16 or f32 for this model's KV cache");
  }
}

void KvLayout::write_k(std::byte* page, int layer, int slot, const float* k_row) const {
  if (k_type == DType::F32) {
    auto* tiles = reinterpret_cast<float*>(page);
    for (int h = 0; h < n_kv_heads; ++h) {
      float* tile = tiles + k_tile(layer, h) + slot;
      for (int d = 0; d < head_dim; ++d) tile[size_t(d) * page_tokens] = k_row[h * head_dim + d];
    }
    return;
  }
  quantize_row(k_type, k_row, page + layer_k(layer).offset + size_t(slot) * k_row_bytes(), kv_dim());
}

void KvLayout::read_k(const std::byte* page, int layer, int slot, float* k_row) const {
  if (k_type == DType::F32) {
    const auto* tiles = reinterpret_cast<const float*>(page);
    for (int h = 0; h < n_kv_heads; ++h) {
      const float* tile = tiles + k_tile(layer, h) + slot;
      for (int d = 0; d < head_dim; ++d) k_row[h * head_dim + d] = tile[size_t(d) * page_tokens];
    }
    return;
  }
  dequantize_row(k_type, page + layer_k(layer).offset + size_t(slot) * k_row_bytes(), k_row, kv_dim());
}

void KvLayout::write_v(std::byte* page, int layer, int slot, const float* v_row) const {
  std::byte* dst = page + layer_v(layer).offset + size_t(slot) * v_row_bytes();
  if (v_type == DType::F32)
    std::memcpy(dst, v_row, v_row_bytes());
  else
    quantize_row(v_type, v_row, dst, kv_dim());
}

void KvLayout::read_v(const std::byte* page, int layer, int slot, float* v_row) const {
  const std::byte* src = page + layer_v(layer).offset + size_t(slot) * v_row_bytes();
  if (v_type == DType::F32)
    std::memcpy(v_row, src, v_row_bytes());
  else
    dequantize_row(v_type, src, v_row, kv_dim());
}

}  // namespace choreo::kernels
