#pragma once
// Device functions shared by choreo's CUDA kernels (no kernels here, so any kernel header can include it):
// fp16 bits to float, grid-stride loop indices, and ggml blocks (sizes, elements).

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// IEEE binary16 bits -> float (exact).
CHOREO_HOST_DEVICE inline float half_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24
    const float v = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                       : sign | ((exponent + 112u) << 23) | (mantissa << 13);
  return cu::bits_to_float(bits);
}

/// float -> IEEE binary16 bits, rounded to nearest even (overflow to infinity, NaN kept quiet with its top
/// payload bits), as kernels/quant.cc's fp32_to_fp16.
CHOREO_HOST_DEVICE inline uint32_t float_to_half_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 113) {  // a half subnormal or zero, in units of 2^-24
    if (exponent < 102) return sign;
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u, shift = 126 - exponent;
    uint32_t quotient = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (quotient & 1u))) ++quotient;
    return sign | quotient;
  }
  uint32_t half_bits = ((exponent - 112) << 10) | ((magnitude >> 13) & 0x3ffu);
  const uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half_bits & 1u))) ++half_bits;
  return sign | half_bits;
}

/// float -> bfloat16 bits, rounded to nearest even (NaN kept quiet), as kernels/quant.cc's fp32_to_bf16.
CHOREO_HOST_DEVICE inline uint32_t float_to_bf16_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

/// The global index of this thread and the grid's stride, for grid-stride loops.
CHOREO_DEVICE inline size_t global_index() {
  return size_t(cu::block_idx().x) * cu::block_dim().x + cu::thread_idx().x;
}
CHOREO_DEVICE inline size_t grid_stride() { return size_t(cu::grid_dim().x) * cu::block_dim().x; }

/// Blocks of 256 threads for a grid-stride loop over n elements: one per 256 elements, 1 to 65,535.
CHOREO_HOST_DEVICE inline unsigned grid_stride_blocks(size_t n) {
  const size_t blocks = (n + 255) / 256;
  return unsigned(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

/// Bytes per block of a format (kernel_args.h).
CHOREO_HOST_DEVICE inline int block_bytes(BlockFormat f) {
  return f == BlockFormat::Q8_0 ? 34 : f == BlockFormat::Q4_0 ? 18 : 20;
}

/// Element j of the ggml block that starts at byte `b` of src, dequantised exactly as kernels/quant.cc does.
CHOREO_DEVICE inline float block_element(cu::Ptr<const uint8_t> src, BlockFormat f, size_t b, int j) {
  const float d = half_to_float(uint32_t(src[b]) | uint32_t(src[b + 1]) << 8);
  if (f == BlockFormat::Q8_0) return d * float(int8_t(src[b + 2 + size_t(j)]));
  const uint8_t byte = src[b + (f == BlockFormat::Q4_0 ? 2 : 4) + size_t(j % 16)];
  const int q = j < 16 ? byte & 0x0f : byte >> 4;
  if (f == BlockFormat::Q4_0) return d * float(q - 8);
  return d * float(q) + half_to_float(uint32_t(src[b + 2]) | uint32_t(src[b + 3]) << 8);
}

}  // namespace choreo::cuda::kernels
