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

#include "kernels/cpu/attention_kernels.h"

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

}  // namespace

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
