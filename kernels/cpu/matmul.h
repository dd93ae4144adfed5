#pragma once
// Matrix products of a GGUF weight with fp32 activations on the CPU, for every supported weight type.
//
// Quantised weights (Q8_0, Q4_0, Q4_1) are multiplied as llama.cpp does: each activation row is quantised
// once per call to 8-bit blocks of 32 (per-block fp32 scale, round to nearest even), and every block pair
// is an exact integer dot product scaled by both blocks' scales. Float weights (F32, F16, BF16) use fp32
// FMA. Threads: the kernel pool's (kernels/cpu/thread_pool.h; the backend sizes it). The SIMD level
// is chosen at run time (kernels/cpu/cpu_features.h); for quantised weights every level gives bit-identical
// results, for float weights they differ only by summation order.
//
// Weights can be used in place, as mapped from the GGUF file: each thread then re-lays a few rows at a time
// into a small cache-resident panel on the fly (see matmul_avx512.cc). pack_weight() does that re-lay once,
// at load, into a copy of the same size, which AVX-512 products then read as they are: decode streams each
// weight byte once, with no per-token re-lay. Packed or not, the results are the same, bit for bit.

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/backend.h"

namespace choreo::kernels::cpu {

/// y[i, :] = W · x[i, :] for i < n; x is [n, w.n_in], y is [n, w.n_out], both fp32 row-major.
/// Throws InputError for an unsupported weight type or a row length that is not a whole number of blocks.
void matmul(const Weight& w, const float* x, int n, float* y);

/// matmul(*o.w, x, n, o.y) for every o of `outputs` (weights of one n_in), with the same results bit for bit.
/// On AVX-512, quantised weights of one type run as one product: the input quantised once, one parallel
/// loop over all their panels (decode: a layer's q, k and v meet the threads once instead of three times).
void matmul_group(std::span<const MatmulOutput> outputs, const float* x, int n);

/// A copy of a quantised weight (Q8_0, Q4_0, Q4_1) in the AVX-512 panel layout, for Weight::packed; null when
/// this CPU has no AVX-512 or the type has no packed layout. Throws InputError as matmul() does.
std::shared_ptr<const void> pack_weight(const Weight& w);

/// out[i, :] = row rows[i] of w, dequantised to fp32 (embedding lookup); out is [rows.size(), w.n_in].
/// Throws InputError for a row id outside [0, w.n_out) or an unsupported type.
void dequantize_rows(const Weight& w, std::span<const int32_t> rows, float* out);

}  // namespace choreo::kernels::cpu
