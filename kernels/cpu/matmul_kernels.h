#pragma once
// What matmul.cc and its per-ISA implementations (matmul_scalar.cc, matmul_avx2.cc, matmul_avx512.cc)
// share. Not a public interface: callers use kernels/cpu/matmul.h.
//
// The arithmetic every level performs for quantised weights, in this order, so that all levels agree bit
// for bit. It is llama.cpp's (ggml's Q8_0 / Q8_1 activation blocks), so results track the reference
// implementation up to summation order: an activation block x (32 floats) with d = amax / 127 becomes
// q = round_even(x * (127 / amax)), with scale fp16(d) and, for Q4_1, scaled sum fp16(d * Σq); then for
// each weight block (true integer values w, scale dw, Q4_1 minimum m):
//   acc = fma(float(Σ w·q), dw * scale, acc)          (the integer sum is exact)
//   acc = fma(m, scaled_sum, acc)                     (Q4_1 only)
// accumulated over the blocks of a row in order, starting from acc = 0.

#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace choreo::kernels::cpu {

/// Per-block data of one activation row quantised to 8 bits (the values are stored apart).
struct ActivationBlock {
  float scale;         // x ≈ scale * q (an fp16 value)
  int32_t correction;  // added to an integer dot product whose weights were offset to be unsigned
  float scaled_sum;    // fp16(amax / 127 * Σq), the factor of Q4_1's minimum
  int32_t sum;         // Σq
};

/// A contiguous range [begin, end) of units of work (panels, rows) that one thread computes.
struct WorkRange {
  int64_t begin = 0;
  int64_t end = 0;
};

/// How many units (panels or rows of `unit_rows` weight rows each) one piece of a matrix product's work
/// takes from the pool (kernels/cpu/thread_pool.h). Up to 8 pieces per thread, so that a thread held off its
/// core by another process leaves little for the others to wait on; but none smaller than ~16 KiB of
/// weights times activation rows, and a whole number of pieces per thread.
int64_t matmul_grain(const Weight& w, int64_t n_units, int64_t unit_rows, int n);

/// The reference activation quantiser: n_in floats (a multiple of 32) to int8 values and per-block data.
/// correction = correction_per_sum * Σq. The SIMD levels reproduce its output exactly.
void quantize_activation_row_scalar(const float* x, int64_t n_in, int32_t correction_per_sum, int8_t* values,
                                    ActivationBlock* blocks);

/// Q8_0, Q4_0 and Q4_1: the types multiplied as integer dot products on quantised activations.
inline bool is_block_quantised(DType type) {
  return type == DType::Q8_0 || type == DType::Q4_0 || type == DType::Q4_1;
}

/// The AVX-512 panel layout of a quantised weight (matmul_avx512.cc): its size, which is the rows' size
/// rounded up to whole 16-row panels of whole cache lines, and the packing into `out` (64-byte aligned).
/// The weight was validated.
size_t packed_bytes_avx512(const Weight& w);
void pack_weight_avx512(const Weight& w, uint8_t* out);

// One implementation per SIMD level; arguments were validated by matmul(). matmul_avx512 reads w.packed
// when it is set.
void matmul_scalar(const Weight& w, const float* x, int n, float* y);
void matmul_avx2(const Weight& w, const float* x, int n, float* y);
void matmul_avx512(const Weight& w, const float* x, int n, float* y);
/// Several quantised weights of one type and n_in (at most kMaxGroupWeights) times one input.
constexpr size_t kMaxGroupWeights = 8;
void matmul_group_avx512(std::span<const MatmulOutput> outputs, const float* x, int n);

}  // namespace choreo::kernels::cpu
