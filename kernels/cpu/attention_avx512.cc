// The two inner products of segment attention (attention.cc) with AVX-512: scores of query vectors against
// a page's key tile, and the probability-weighted sum of a page's value rows.
//
// The portable loops in attention.cc keep one chain of fused multiply-adds per 16 outputs, so they wait on
// the FMA latency; these keep up to 8 independent chains in flight and load each key or value vector once
// for several queries. Every output is still the same chain in the same order (fma over d for a score,
// over j for a value sum), so the results are those of attention.cc's x86-64-v4 code, bit for bit.

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/quant.h"

namespace choreo::kernels::cpu {

namespace {

constexpr int kLanes = 16;

/// NQ queries (head_dim floats each) against the keys [j0, j0 + 16) of a [head_dim][ld] tile.
template <int NQ>
void scores_block(const float* qs, const float* kt, int n_keys, int ld, int head_dim, float scale, float* s) {
  const __m512 factor = _mm512_set1_ps(scale);
  for (int j0 = 0; j0 < n_keys; j0 += kLanes) {
    __m512 acc[NQ];
#pragma GCC unroll 8
    for (int i = 0; i < NQ; ++i) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; ++d) {
      const __m512 k = _mm512_loadu_ps(kt + size_t(d) * ld + j0);
#pragma GCC unroll 8
      for (int i = 0; i < NQ; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(qs[size_t(i) * head_dim + d]), k, acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; ++i) _mm512_storeu_ps(s + size_t(i) * ld + j0, _mm512_mul_ps(acc[i], factor));
  }
}

/// NQ rows of D floats: acc = acc * corr + sum_j p[j] * v[j].
template <int NQ, int D>
void accumulate_block(float* acc, const float* corr, const float* p, int ld, const float* v, size_t v_stride,
                      int n_keys) {
  constexpr int kVectors = D / kLanes;
  __m512 a[NQ][kVectors];
#pragma GCC unroll 4
  for (int i = 0; i < NQ; ++i) {
    const __m512 c = _mm512_set1_ps(corr[i]);
#pragma GCC unroll 8
    for (int b = 0; b < kVectors; ++b) a[i][b] = _mm512_mul_ps(_mm512_loadu_ps(acc + size_t(i) * D + b * kLanes), c);
  }
  for (int j = 0; j < n_keys; ++j) {
    const float* vj = v + size_t(j) * v_stride;
    __m512 vv[kVectors];
#pragma GCC unroll 8
    for (int b = 0; b < kVectors; ++b) vv[b] = _mm512_loadu_ps(vj + b * kLanes);
#pragma GCC unroll 4
    for (int i = 0; i < NQ; ++i) {
      const __m512 w = _mm512_set1_ps(p[size_t(i) * ld + j]);
#pragma GCC unroll 8
      for (int b = 0; b < kVectors; ++b) a[i][b] = _mm512_fmadd_ps(w, vv[b], a[i][b]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 8
    for (int b = 0; b < kVectors; ++b) _mm512_storeu_ps(acc + size_t(i) * D + b * kLanes, a[i][b]);
}

template <int D>
void accumulate_rows(float* acc, const float* corr, const float* p, int nq, int ld, const float* v, size_t v_stride,
                     int n_keys) {
  constexpr int kRows = D <= 64 ? 2 : 1;  // 2 x 64 or 1 x 128 floats: 8 registers of chains
  int i = 0;
  for (; i + kRows <= nq; i += kRows)
    accumulate_block<kRows, D>(acc + size_t(i) * D, corr + i, p + size_t(i) * ld, ld, v, v_stride, n_keys);
  for (; i < nq; ++i) accumulate_block<1, D>(acc + size_t(i) * D, corr + i, p + size_t(i) * ld, ld, v, v_stride, n_keys);
}

/// 32 floats (two vectors) of one Q8_0 block: int8 times the block's fp16 scale, as q8_0_row computes them.
[[gnu::always_inline]] inline void q8_0_block(const std::byte* src, __m512& low, __m512& high) {
  uint16_t d;
  std::memcpy(&d, src, sizeof(d));
  const __m512 scale = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(d)));
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + sizeof(d)));
  low = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), scale);
  high = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), scale);
}

/// One row of n values (a multiple of 16, or of 32 for Q8_0) in a cache type, as floats.
[[gnu::always_inline]] inline void decode_row(DType type, const std::byte* src, float* dst, int n) {
  if (type == DType::F16) {
    for (int i = 0; i < n; i += kLanes)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i))));
    return;
  }
  for (int b = 0; b < n / kQuantBlock; ++b) {
    __m512 low, high;
    q8_0_block(src + size_t(b) * sizeof(BlockQ8_0), low, high);
    _mm512_storeu_ps(dst + b * kQuantBlock, low);
    _mm512_storeu_ps(dst + b * kQuantBlock + kLanes, high);
  }
}

}  // namespace

bool decode_rows_avx512(DType type, const std::byte* rows, size_t row_bytes, int n_rows, int n, float* out,
                        size_t out_stride) {
  if (n % (type == DType::F16 ? kLanes : kQuantBlock) != 0 || (type != DType::F16 && type != DType::Q8_0))
    return false;
  for (int t = 0; t < n_rows; ++t) decode_row(type, rows + size_t(t) * row_bytes, out + size_t(t) * out_stride, n);
  return true;
}

bool decode_key_tile_avx512(DType type, const std::byte* rows, size_t row_bytes, int n_keys, int head_dim, int ld,
                            float* tile) {
  if (head_dim % kQuantBlock != 0 || head_dim > 256 || (type != DType::F16 && type != DType::Q8_0)) return false;
  // 16 keys at a time: decode them into a [16][head_dim] block, then transpose it 16 x 16 floats at a time in
  // registers and write each dimension's 16 keys as one row of the tile.
  alignas(64) float block[kLanes * 256];
  for (int t0 = 0; t0 < n_keys; t0 += kLanes) {
    const int n = std::min(kLanes, n_keys - t0);
    for (int t = 0; t < kLanes; ++t) {
      if (t < n)
        decode_row(type, rows + size_t(t0 + t) * row_bytes, block + t * head_dim, head_dim);
      else
        std::memset(block + t * head_dim, 0, sizeof(float) * size_t(head_dim));
    }
    const __mmask16 keys = static_cast<__mmask16>((1u << n) - 1);
    for (int c0 = 0; c0 < head_dim; c0 += kLanes) {
      __m512 r[kLanes], t[kLanes], u[kLanes];
#pragma GCC unroll 16
      for (int k = 0; k < kLanes; ++k) r[k] = _mm512_load_ps(block + k * head_dim + c0);
      // Within each 128-bit lane: pairs, then quads of rows.
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
      }
      // u[4g + j], lane k: column 4k + j of rows 4g .. 4g + 3.
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
      }
      // Across lanes: column 4k + j gathers lane k of u[j], u[4 + j], u[8 + j], u[12 + j].
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xee);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xee);
        const __m512 columns[4] = {_mm512_shuffle_f32x4(v0, v2, 0x88), _mm512_shuffle_f32x4(v0, v2, 0xdd),
                                   _mm512_shuffle_f32x4(v1, v3, 0x88), _mm512_shuffle_f32x4(v1, v3, 0xdd)};
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k)
          _mm512_mask_storeu_ps(tile + size_t(c0 + 4 * k + j) * ld + t0, keys, columns[k]);
      }
    }
  }
  return true;
}

bool scores_tile_avx512(const float* qs, int nq, const float* kt, int n_keys, int ld, int head_dim, float scale,
                        float* s) {
  if (ld % kLanes != 0) return false;
  int i = 0;
  for (; i + 8 <= nq; i += 8) scores_block<8>(qs + size_t(i) * head_dim, kt, n_keys, ld, head_dim, scale, s + size_t(i) * ld);
  const float* q = qs + size_t(i) * head_dim;
  float* out = s + size_t(i) * ld;
  switch (nq - i) {
    case 7: scores_block<7>(q, kt, n_keys, ld, head_dim, scale, out); break;
    case 6: scores_block<6>(q, kt, n_keys, ld, head_dim, scale, out); break;
    case 5: scores_block<5>(q, kt, n_keys, ld, head_dim, scale, out); break;
    case 4: scores_block<4>(q, kt, n_keys, ld, head_dim, scale, out); break;
    case 3: scores_block<3>(q, kt, n_keys, ld, head_dim, scale, out); break;
    case 2: scores_block<2>(q, kt, n_keys, ld, head_dim, scale, out); break;
    case 1: scores_block<1>(q, kt, n_keys, ld, head_dim, scale, out); break;
    default: break;
  }
  return true;
}

bool accumulate_tile_avx512(float* acc, const float* corr, const float* p, int nq, int ld, const float* v,
                            size_t v_stride, int n_keys, int head_dim) {
  if (head_dim == 64) return accumulate_rows<64>(acc, corr, p, nq, ld, v, v_stride, n_keys), true;
  if (head_dim == 128) return accumulate_rows<128>(acc, corr, p, nq, ld, v, v_stride, n_keys), true;
  return false;
}

}  // namespace choreo::kernels::cpu
