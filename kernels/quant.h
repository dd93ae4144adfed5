#pragma once
// Scalar number formats and ggml's block-quantised formats, byte for byte as GGUF stores them, with
// quantisers that round exactly as ggml's reference quantisers do (so a file choreo writes is the file
// llama.cpp's quantiser would write from the same floats).

#include <cstdint>

#include "kernels/dtype.h"

namespace choreo::kernels {

/// fp32 -> IEEE binary16, round to nearest even; overflow gives ±inf, NaN stays a (quiet) NaN.
uint16_t fp32_to_fp16(float value);
/// IEEE binary16 -> fp32 (exact: every half is a float).
float fp16_to_fp32(uint16_t bits);
/// fp32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
uint16_t fp32_to_bf16(float value);
/// bfloat16 -> fp32 (exact: the high half of a float).
float bf16_to_fp32(uint16_t bits);

/// Elements per block of every block-quantised type choreo supports.
inline constexpr int kQuantBlock = 32;

/// ggml block_q8_0: x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQuantBlock];
};
static_assert(sizeof(BlockQ8_0) == 34);

/// ggml block_q4_0: x[i] = d * (q[i] - 8); byte j holds element j (low nibble) and element j+16 (high).
struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQuantBlock / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

/// ggml block_q4_1: x[i] = d * q[i] + m; nibbles laid out as in BlockQ4_0.
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[kQuantBlock / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

/// Encodes n floats as type t into dst (row_bytes(t, n) bytes). Throws InputError for a type choreo
/// cannot write or an n that is not a whole number of blocks.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

/// Decodes n elements of type t from src into floats. Throws InputError like quantize_row.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

}  // namespace choreo::kernels
