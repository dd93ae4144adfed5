#pragma once
// What attention.cc and its AVX-512 inner products (attention_avx512.cc) share. Not a public interface.

#include <cstddef>

#include "kernels/dtype.h"

namespace choreo::kernels::cpu {

/// attention.cc's scores_tile and accumulate_tile with AVX-512, giving the same bits as its x86-64-v4 code.
/// Each returns false, computing nothing, for a shape it does not handle (key tiles whose width is not a
/// multiple of 16; head sizes other than 64 and 128); call only when simd_level() is Avx512.
bool scores_tile_avx512(const float* qs, int nq, const float* kt, int n_keys, int ld, int head_dim, float scale,
                        float* s);
bool accumulate_tile_avx512(float* acc, const float* corr, const float* p, int nq, int ld, const float* v,
                            size_t v_stride, int n_keys, int head_dim);
/// attention.cc's softmax_rows (one page's softmax step for nq score rows ld floats apart, row i keeping its
/// first limit[i] scores), giving the same bits as its x86-64-v4 code; false, computing nothing, when ld is
/// not a multiple of 16.
bool softmax_rows_avx512(float* s, int nq, int ld, const int* limit, const float* m, float* row_max, float* row_sum);

/// Decodes n_rows rows of n values in a cache type (F16 or Q8_0; rows row_bytes apart) to floats, out_stride
/// floats apart; the values are attention.cc's decode_row's exactly (both conversions are exact).
bool decode_rows_avx512(DType type, const std::byte* rows, size_t row_bytes, int n_rows, int n, float* out,
                        size_t out_stride);
/// The same for one head's keys, written transposed into a [head_dim][ld] tile (key t in column t).
bool decode_key_tile_avx512(DType type, const std::byte* rows, size_t row_bytes, int n_keys, int head_dim, int ld,
                            float* tile);

}  // namespace choreo::kernels::cpu
