// The inner loops of segment attention (attention.cc) with AVX-512: scores of query vectors against a page's
// key tile, the softmax step of a page, and the probability-weighted sum of a page's value rows.
//
// The portable loops in attention.cc keep one chain of fused multiply-adds per 16 outputs, so they wait on
// the FMA latency; these keep 16 independent chains in flight (tiles of 8 queries x 32 keys, or 4 rows x 64
// value dims) and load each key or value vector once for several queries. Every output is still the same
// chain in the same order (fma over d for a score, over j for a value sum). The softmax step computes
// exp_inplace's polynomial 16 lanes at a time and adds each row's sum left to right, 16 rows at once in the
// lanes of a transposed block. So the results are those of attention.cc's x86-64-v4 code, bit for bit.

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

/// The step both inner products are made of: a[i][b] += x[i * stride] * y[b] for an R x C tile of registers
/// (one rank-1 update; each output stays one chain of fused multiply-adds).
template <int R, int C>
[[gnu::always_inline]] inline void rank1_update(__m512 (&a)[R][C], const __m512 (&y)[C], const float* x,
                                                size_t stride) {
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    const __m512 w = _mm512_set1_ps(x[size_t(i) * stride]);
#pragma GCC unroll 8
    for (int b = 0; b < C; ++b) a[i][b] = _mm512_fmadd_ps(w, y[b], a[i][b]);
  }
}

/// NQ queries (head_dim floats each) against KB blocks of 16 keys from j0 of a [head_dim][ld] tile.
template <int NQ, int KB>
[[gnu::always_inline]] inline void scores_keys(const float* qs, const float* kt, int j0, int ld, int head_dim,
                                               __m512 factor, float* s) {
  __m512 acc[NQ][KB];
#pragma GCC unroll 8
  for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 2
    for (int b = 0; b < KB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int d = 0; d < head_dim; ++d) {
    __m512 k[KB];
#pragma GCC unroll 2
    for (int b = 0; b < KB; ++b) k[b] = _mm512_loadu_ps(kt + size_t(d) * ld + j0 + b * kLanes);
    rank1_update(acc, k, qs + d, size_t(head_dim));
  }
#pragma GCC unroll 8
  for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 2
    for (int b = 0; b < KB; ++b)
      _mm512_storeu_ps(s + size_t(i) * ld + j0 + b * kLanes, _mm512_mul_ps(acc[i][b], factor));
}

/// NQ queries against the keys [0, n_keys) of a [head_dim][ld] tile, 32 keys at a time (each query value
/// then feeds two multiply-adds per load), the last 16 alone.
template <int NQ>
void scores_block(const float* qs, const float* kt, int n_keys, int ld, int head_dim, float scale, float* s) {
  const __m512 factor = _mm512_set1_ps(scale);
  int j0 = 0;
  for (; j0 + 2 * kLanes <= n_keys; j0 += 2 * kLanes) scores_keys<NQ, 2>(qs, kt, j0, ld, head_dim, factor, s);
  for (; j0 < n_keys; j0 += kLanes) scores_keys<NQ, 1>(qs, kt, j0, ld, head_dim, factor, s);
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
    rank1_update(a, vv, p + j, size_t(ld));
  }
#pragma GCC unroll 4
  for (int i = 0; i < NQ; ++i)
#pragma GCC unroll 8
    for (int b = 0; b < kVectors; ++b) _mm512_storeu_ps(acc + size_t(i) * D + b * kLanes, a[i][b]);
}

template <int D>
void accumulate_rows(float* acc, const float* corr, const float* p, int nq, int ld, const float* v, size_t v_stride,
                     int n_keys) {
  constexpr int kRows = D <= 64 ? 4 : 2;  // 4 x 64 or 2 x 128 floats: 16 registers of chains
  int i = 0;
  for (; i + kRows <= nq; i += kRows)
    accumulate_block<kRows, D>(acc + size_t(i) * D, corr + i, p + size_t(i) * ld, ld, v, v_stride, n_keys);
  for (; i < nq; ++i) accumulate_block<1, D>(acc + size_t(i) * D, corr + i, p + size_t(i) * ld, ld, v, v_stride, n_keys);
}

/// A 16 x 16 transpose in registers: lane k of out[c] is lane c of r[k].
[[gnu::always_inline]] inline void transpose16(const __m512 r[kLanes], __m512 out[kLanes]) {
  __m512 t[kLanes], u[kLanes];
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
    out[j] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    out[4 + j] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
    out[8 + j] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    out[12 + j] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
  }
}

/// attention.cc's exp_inplace for 16 floats, as its x86-64-v4 clone computes it: the same operations, fused
/// into the same multiply-adds, so the same bits (the SIMD-level test compares the two).
[[gnu::always_inline]] inline __m512 exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.0f);
  const __m512 v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, low, _CMP_LT_OQ), x, low);
  const __m512 k = _mm512_roundscale_ps(
      _mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

/// The mask of lanes [0, n) of a 16-lane block (n clamped to 0 .. 16).
inline __mmask16 first_lanes(int n) {
  return n <= 0 ? __mmask16(0) : n >= kLanes ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1);
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
      __m512 r[kLanes], columns[kLanes];
#pragma GCC unroll 16
      for (int k = 0; k < kLanes; ++k) r[k] = _mm512_load_ps(block + k * head_dim + c0);
      transpose16(r, columns);
#pragma GCC unroll 16
      for (int c = 0; c < kLanes; ++c) _mm512_mask_storeu_ps(tile + size_t(c0 + c) * ld + t0, keys, columns[c]);
    }
  }
  return true;
}

bool softmax_rows_avx512(float* s, int nq, int ld, const int* limit, const float* m, float* mx, float* sum) {
  if (ld % kLanes != 0) return false;
  int widest = 0;  // columns any row keeps; past them every row is zeros
  for (int i = 0; i < nq; ++i) {
    float* si = s + size_t(i) * ld;
    const int n = limit[i];
    widest = std::max(widest, n);  // a row with n <= 0 only gets zeros (and mx = m, which the caller ignores)
    __m512 high = _mm512_set1_ps(m[i]);
    for (int j0 = 0; j0 < n; j0 += kLanes)
      high = _mm512_mask_max_ps(high, first_lanes(n - j0), high, _mm512_maskz_loadu_ps(first_lanes(n - j0), si + j0));
    mx[i] = _mm512_reduce_max_ps(high);
    const __m512 shift = _mm512_set1_ps(mx[i]);
    int j0 = 0;
    for (; j0 < n; j0 += kLanes) {
      const __mmask16 keep = first_lanes(n - j0);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(keep, si + j0), shift));
      _mm512_storeu_ps(si + j0, _mm512_maskz_mov_ps(keep, e));
    }
    for (; j0 < ld; j0 += kLanes) _mm512_storeu_ps(si + j0, _mm512_setzero_ps());  // blocks past the limit
  }
  // Each row's sum left to right from 0, as run_tile's loop adds it: 16 rows at a time, one per lane, by
  // transposing 16 x 16 blocks (adding the zeros past a row's limit leaves its sum as it was).
  const int columns = (widest + kLanes - 1) / kLanes * kLanes;
  for (int i0 = 0; i0 < nq; i0 += kLanes) {
    const int rows = std::min(kLanes, nq - i0);
    __m512 total = _mm512_setzero_ps();
    for (int j0 = 0; j0 < columns; j0 += kLanes) {
      __m512 r[kLanes], c[kLanes];
#pragma GCC unroll 16
      for (int k = 0; k < kLanes; ++k)
        r[k] = k < rows ? _mm512_loadu_ps(s + size_t(i0 + k) * ld + j0) : _mm512_setzero_ps();
      transpose16(r, c);
#pragma GCC unroll 16
      for (int k = 0; k < kLanes; ++k) total = _mm512_add_ps(total, c[k]);
    }
    _mm512_mask_storeu_ps(sum + i0, first_lanes(rows), total);
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
