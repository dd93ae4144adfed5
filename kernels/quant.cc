#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace choreo::kernels {

uint16_t fp32_to_fp16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 113) {               // below 2^-14: a half subnormal (or zero), in units of 2^-24
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t quotient = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (quotient & 1u))) ++quotient;
    return static_cast<uint16_t>(sign | quotient);
  }
  uint32_t half_bits = ((exponent - 112) << 10) | ((magnitude >> 13) & 0x3ffu);
  const uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half_bits & 1u)))
    ++half_bits;  // carries into exponent
  return static_cast<uint16_t>(sign | half_bits);
}

float fp16_to_fp32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t fp32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float bf16_to_fp32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

namespace {

void quantize_q8_0(const float* src, BlockQ8_0* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQuantBlock) {
    float max_abs = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) max_abs = std::max(max_abs, std::fabs(src[i]));
    const float scale = max_abs / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    dst[b].d = fp32_to_fp16(scale);
    for (int i = 0; i < kQuantBlock; ++i) dst[b].qs[i] = static_cast<int8_t>(std::round(src[i] * inverse));
  }
}

void quantize_q4_0(const float* src, BlockQ4_0* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQuantBlock) {
    // The scale maps the element of largest magnitude (with its sign) to -8, the one-sided end of [-8, 7].
    float max_abs = 0.0f, extreme = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) {
      if (max_abs < std::fabs(src[i])) {
        max_abs = std::fabs(src[i]);
        extreme = src[i];
      }
    }
    const float scale = extreme / -8.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    dst[b].d = fp32_to_fp16(scale);
    for (int i = 0; i < kQuantBlock / 2; ++i) {
      const int low = std::min(15, static_cast<int>(src[i] * inverse + 8.5f));
      const int high = std::min(15, static_cast<int>(src[i + 16] * inverse + 8.5f));
      dst[b].qs[i] = static_cast<uint8_t>(low | (high << 4));
    }
  }
}

void quantize_q4_1(const float* src, BlockQ4_1* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQuantBlock) {
    float minimum = FLT_MAX, maximum = -FLT_MAX;
    for (int i = 0; i < kQuantBlock; ++i) {
      minimum = std::min(minimum, src[i]);
      maximum = std::max(maximum, src[i]);
    }
    const float scale = (maximum - minimum) / 15.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    dst[b].d = fp32_to_fp16(scale);
    dst[b].m = fp32_to_fp16(minimum);
    for (int i = 0; i < kQuantBlock / 2; ++i) {
      const int low = std::min(15, static_cast<int>((src[i] - minimum) * inverse + 0.5f));
      const int high = std::min(15, static_cast<int>((src[i + 16] - minimum) * inverse + 0.5f));
      dst[b].qs[i] = static_cast<uint8_t>(low | (high << 4));
    }
  }
}

void dequantize_q8_0(const BlockQ8_0* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQuantBlock) {
    const float scale = fp16_to_fp32(src[b].d);
    for (int i = 0; i < kQuantBlock; ++i) dst[i] = scale * static_cast<float>(src[b].qs[i]);
  }
}

void dequantize_q4_0(const BlockQ4_0* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQuantBlock) {
    const float scale = fp16_to_fp32(src[b].d);
    for (int i = 0; i < kQuantBlock / 2; ++i) {
      dst[i] = scale * static_cast<float>((src[b].qs[i] & 0x0f) - 8);
      dst[i + 16] = scale * static_cast<float>((src[b].qs[i] >> 4) - 8);
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQuantBlock) {
    const float scale = fp16_to_fp32(src[b].d);
    const float minimum = fp16_to_fp32(src[b].m);
    for (int i = 0; i < kQuantBlock / 2; ++i) {
      dst[i] = scale * static_cast<float>(src[b].qs[i] & 0x0f) + minimum;
      dst[i + 16] = scale * static_cast<float>(src[b].qs[i] >> 4) + minimum;
    }
  }
}

// Validates (t, n) and returns the number of blocks (elements for scalar types).
int64_t checked_blocks(DType t, int64_t n, const char* what) {
  if (!is_supported(t)) {
    throw InputError(fmt::format("cannot {} tensor type {}", what, type_traits(t).name),
                     "supported types: F32, F16, BF16, Q8_0, Q4_0, Q4_1");
  }
  const uint32_t block = type_traits(t).block_elems;
  if (n < 0 || n % block != 0) {
    throw InputError(fmt::format("cannot {} {} elements as {}: not a whole number of {}-element blocks", what,
                                 n, type_traits(t).name, block));
  }
  return n / block;
}

}  // namespace

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const int64_t n_blocks = checked_blocks(t, n, "quantize");
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0:
      return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n_blocks);
    case DType::Q4_0:
      return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), n_blocks);
    case DType::Q4_1:
      return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), n_blocks);
    default:
      return;  // unreachable: checked_blocks rejected it
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t n_blocks = checked_blocks(t, n, "dequantize");
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(in[i]);
      return;
    }
    case DType::BF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(in[i]);
      return;
    }
    case DType::Q8_0:
      return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, n_blocks);
    case DType::Q4_0:
      return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, n_blocks);
    case DType::Q4_1:
      return dequantize_q4_1(static_cast<const BlockQ4_1*>(src), dst, n_blocks);
    default:
      return;
  }
}

}  // namespace choreo::kernels
