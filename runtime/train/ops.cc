#include "runtime/train/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace choreo::train {

namespace {

/// c (m x n) = alpha op(a) op(b) + beta c, row-major; op(a) is m x k, op(b) k x n.
template <class T>
void gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, const T* b, T beta, T* c) {
  if (m == 0 || n == 0) return;
  const int lda = ta ? m : k, ldb = tb ? k : n;
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
  else
    cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
}

/// The frozen weight as T: the float weights themselves, or a double copy (the reference path).
template <class T>
struct WeightAs {
  std::vector<T> copy;
  const T* p = nullptr;
  WeightAs(const float* w, size_t n) {
    if constexpr (std::is_same_v<T, float>) {
      p = w;
    } else {
      copy.assign(w, w + n);
      p = copy.data();
    }
  }
};

/// The inverse frequencies of the rotated pairs, as kernels::cpu::rope computes them.
std::vector<double> inverse_frequencies(const kernels::RopeParams& p) {
  std::vector<double> out(size_t(p.n_dims / 2));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = std::pow(double(p.freq_base), -2.0 * double(i) / double(p.n_dims));
    if (p.freq_factors) out[i] /= double(p.freq_factors[i]);
  }
  return out;
}

/// cos and sin of each pair's angle at `pos` (negated angles when `inverse`), rounded once to T.
template <class T>
void angles(int64_t pos, const std::vector<double>& inv_freq, bool inverse, T* c, T* s) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double theta = double(pos) * inv_freq[i];
    c[i] = T(std::cos(theta));
    s[i] = inverse ? T(-std::sin(theta)) : T(std::sin(theta));
  }
}

template <class T>
void rotate(T* h, const T* c, const T* s, const kernels::RopeParams& p) {
  const int half = p.n_dims / 2;
  const bool interleaved = p.layout == kernels::RopeParams::Layout::Interleaved;
  for (int i = 0; i < half; ++i) {
    T& a = h[interleaved ? 2 * i : i];
    T& b = h[interleaved ? 2 * i + 1 : i + half];
    const T x0 = a, x1 = b;
    a = x0 * c[i] - x1 * s[i];
    b = x0 * s[i] + x1 * c[i];
  }
}

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

/// Keys of a segment visible to query row i: all, or its own tokens up to causal_base + i.
template <class T>
int visible(const Segment<T>& seg, int i) {
  return seg.causal_base >= 0 ? std::min(seg.n_tokens, seg.causal_base + i + 1) : seg.n_tokens;
}

}  // namespace

template <class T>
void rmsnorm_forward(const T* x, const float* w, int rows, int dim, float eps, T* y) {
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + size_t(r) * dim;
    T ss = 0;
    for (int k = 0; k < dim; ++k) ss += xr[k] * xr[k];
    const T inv = T(1) / std::sqrt(ss / T(dim) + T(eps));
    for (int k = 0; k < dim; ++k) y[size_t(r) * dim + k] = xr[k] * inv * T(w[k]);
  }
}

template <class T>
void rmsnorm_backward(const T* x, const float* w, int rows, int dim, float eps, const T* dy, T* dx, T* dw) {
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + size_t(r) * dim;
    const T* dyr = dy + size_t(r) * dim;
    T ss = 0, dot = 0;
    for (int k = 0; k < dim; ++k) {
      ss += xr[k] * xr[k];
      dot += dyr[k] * T(w[k]) * xr[k];
    }
    const T inv = T(1) / std::sqrt(ss / T(dim) + T(eps));
    const T c = inv * inv * inv * dot / T(dim);
    for (int k = 0; k < dim; ++k) {
      dx[size_t(r) * dim + k] += inv * T(w[k]) * dyr[k] - c * xr[k];
      if (dw) dw[k] += dyr[k] * xr[k] * inv;
    }
  }
}

template <class T>
void rope_rotate(T* x, int rows, int n_heads, int head_dim, const int32_t* positions, const kernels::RopeParams& p,
                 bool inverse) {
  const std::vector<double> inv_freq = inverse_frequencies(p);
  std::vector<T> c(inv_freq.size()), s(inv_freq.size());
  for (int r = 0; r < rows; ++r) {
    angles(positions[r], inv_freq, inverse, c.data(), s.data());
    for (int h = 0; h < n_heads; ++h) rotate(x + (size_t(r) * n_heads + h) * head_dim, c.data(), s.data(), p);
  }
}

template <class T>
void swiglu_forward(const T* g, const T* u, size_t n, T* h) {
  for (size_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

template <class T>
void swiglu_backward(const T* g, const T* u, size_t n, const T* dh, T* dg, T* du) {
  for (size_t i = 0; i < n; ++i) {
    const T sg = sigmoid(g[i]);
    du[i] += dh[i] * g[i] * sg;
    dg[i] += dh[i] * u[i] * sg * (T(1) + g[i] * (T(1) - sg));
  }
}

template <class T>
void linear_forward(const LinearParams<T>& p, const T* x, int rows, T* y, T* xa) {
  const WeightAs<T> w(p.w, size_t(p.n_in) * p.n_out);
  gemm<T>(false, true, rows, p.n_out, p.n_in, T(1), x, w.p, T(0), y);
  if (p.rank == 0) return;
  gemm<T>(false, true, rows, p.rank, p.n_in, T(1), x, p.a, T(0), xa);
  gemm<T>(false, true, rows, p.n_out, p.rank, T(p.scale), xa, p.b, T(1), y);
}

template <class T>
void linear_backward(const LinearParams<T>& p, const T* x, const T* xa, int rows, const T* dy, T* dx, T* da,
                     T* db) {
  if (dx) {
    const WeightAs<T> w(p.w, size_t(p.n_in) * p.n_out);
    gemm<T>(false, false, rows, p.n_in, p.n_out, T(1), dy, w.p, T(1), dx);
  }
  if (p.rank == 0) return;
  std::vector<T> t(size_t(rows) * p.rank);  // dy B
  gemm<T>(false, false, rows, p.rank, p.n_out, T(1), dy, p.b, T(0), t.data());
  if (dx) gemm<T>(false, false, rows, p.n_in, p.rank, T(p.scale), t.data(), p.a, T(1), dx);
  if (da) gemm<T>(true, false, p.rank, p.n_in, rows, T(p.scale), t.data(), x, T(1), da);
  if (db) gemm<T>(true, false, p.n_out, p.rank, rows, T(p.scale), dy, xa, T(1), db);
}

template <class T>
double cross_entropy(const T* logits, int rows, int n_vocab, const int32_t* targets, T* dlogits, double weight) {
  double loss = 0;
  for (int r = 0; r < rows; ++r) {
    const T* l = logits + size_t(r) * n_vocab;
    const double m = double(*std::max_element(l, l + n_vocab));
    double sum = 0;
    for (int k = 0; k < n_vocab; ++k) sum += std::exp(double(l[k]) - m);
    const double lse = m + std::log(sum);
    loss += lse - double(l[targets[r]]);
    if (!dlogits) continue;
    T* d = dlogits + size_t(r) * n_vocab;
    for (int k = 0; k < n_vocab; ++k) d[k] += T(weight * std::exp(double(l[k]) - lse));
    d[targets[r]] -= T(weight);
  }
  return loss;
}

template <class T>
void embedding_forward(const float* table, int dim, std::span<const int32_t> ids, T* out) {
  for (size_t r = 0; r < ids.size(); ++r)
    for (int k = 0; k < dim; ++k) out[r * dim + k] = T(table[size_t(ids[r]) * dim + k]);
}

template <class T>
void embedding_backward(int dim, std::span<const int32_t> ids, const T* dout, T* dtable) {
  for (size_t r = 0; r < ids.size(); ++r)
    for (int k = 0; k < dim; ++k) dtable[size_t(ids[r]) * dim + k] += dout[r * dim + k];
}

template <class T>
void attention_forward(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                       std::span<const Segment<T>> segments, T* o, T* lse) {
  const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads, kv_dim = s.n_kv_heads * hd;
  const T scale = T(1) / std::sqrt(T(hd));
  const std::vector<double> inv_freq = inverse_frequencies(s.rope);
  std::vector<T> c(inv_freq.size()), sn(inv_freq.size()), qs(size_t(s.n_heads) * hd);
  std::vector<T> scores;
  for (int i = 0; i < rows; ++i) {
    // Pass 1: every visible score, segment after segment (queries rotated for each segment's placement).
    scores.clear();
    std::vector<size_t> seg_start;
    for (const Segment<T>& seg : segments) {
      seg_start.push_back(scores.size());
      angles(int64_t(positions[i]) - seg.delta, inv_freq, false, c.data(), sn.data());
      std::copy(q + size_t(i) * s.n_heads * hd, q + size_t(i + 1) * s.n_heads * hd, qs.begin());
      for (int h = 0; h < s.n_heads; ++h) rotate(qs.data() + size_t(h) * hd, c.data(), sn.data(), s.rope);
      const int n = visible(seg, i);
      for (int h = 0; h < s.n_heads; ++h)
        for (int j = 0; j < n; ++j) {
          const T* k = seg.k + size_t(j) * kv_dim + size_t(h / group) * hd;
          const T* qh = qs.data() + size_t(h) * hd;
          T dot = 0;
          for (int d = 0; d < hd; ++d) dot += qh[d] * k[d];
          scores.push_back(dot * scale);
        }
    }
    // Pass 2: per head, the softmax over all segments, then o.
    for (int h = 0; h < s.n_heads; ++h) {
      T m = -std::numeric_limits<T>::infinity();
      for (size_t g = 0; g < segments.size(); ++g) {
        const int n = visible(segments[g], i);
        for (int j = 0; j < n; ++j) m = std::max(m, scores[seg_start[g] + size_t(h) * n + j]);
      }
      T* oh = o + (size_t(i) * s.n_heads + h) * hd;
      std::fill(oh, oh + hd, T(0));
      if (m == -std::numeric_limits<T>::infinity()) {
        lse[size_t(i) * s.n_heads + h] = m;
        continue;
      }
      T sum = 0;
      for (size_t g = 0; g < segments.size(); ++g) {
        const Segment<T>& seg = segments[g];
        const int n = visible(seg, i);
        for (int j = 0; j < n; ++j) {
          const T p = std::exp(scores[seg_start[g] + size_t(h) * n + j] - m);
          sum += p;
          const T* v = seg.v + size_t(j) * kv_dim + size_t(h / group) * hd;
          for (int d = 0; d < hd; ++d) oh[d] += p * v[d];
        }
      }
      for (int d = 0; d < hd; ++d) oh[d] /= sum;
      lse[size_t(i) * s.n_heads + h] = m + std::log(sum);
    }
  }
}

template <class T>
void attention_backward(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                        std::span<const Segment<T>> segments, const T* o, const T* lse, const T* dout, T* dq,
                        std::span<const SegmentGrad<T>> grads) {
  const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads, kv_dim = s.n_kv_heads * hd;
  const T scale = T(1) / std::sqrt(T(hd));
  const std::vector<double> inv_freq = inverse_frequencies(s.rope);
  std::vector<T> c(inv_freq.size()), sn(inv_freq.size()), qs(size_t(s.n_heads) * hd), dqs(size_t(s.n_heads) * hd);
  std::vector<T> dot_o(size_t(s.n_heads));
  for (int i = 0; i < rows; ++i) {
    for (int h = 0; h < s.n_heads; ++h) {
      const T* oh = o + (size_t(i) * s.n_heads + h) * hd;
      const T* dh = dout + (size_t(i) * s.n_heads + h) * hd;
      T dot = 0;
      for (int d = 0; d < hd; ++d) dot += oh[d] * dh[d];
      dot_o[size_t(h)] = dot;
    }
    for (size_t g = 0; g < segments.size(); ++g) {
      const Segment<T>& seg = segments[g];
      const int n = visible(seg, i);
      if (n == 0) continue;
      angles(int64_t(positions[i]) - seg.delta, inv_freq, false, c.data(), sn.data());
      std::copy(q + size_t(i) * s.n_heads * hd, q + size_t(i + 1) * s.n_heads * hd, qs.begin());
      for (int h = 0; h < s.n_heads; ++h) rotate(qs.data() + size_t(h) * hd, c.data(), sn.data(), s.rope);
      std::fill(dqs.begin(), dqs.end(), T(0));
      for (int h = 0; h < s.n_heads; ++h) {
        const T l = lse[size_t(i) * s.n_heads + h];
        const T* qh = qs.data() + size_t(h) * hd;
        const T* dh = dout + (size_t(i) * s.n_heads + h) * hd;
        T* dqh = dqs.data() + size_t(h) * hd;
        for (int j = 0; j < n; ++j) {
          const size_t kv = size_t(j) * kv_dim + size_t(h / group) * hd;
          const T* k = seg.k + kv;
          const T* v = seg.v + kv;
          T sc = 0, dp = 0;
          for (int d = 0; d < hd; ++d) {
            sc += qh[d] * k[d];
            dp += dh[d] * v[d];
          }
          const T p = std::exp(sc * scale - l);
          const T ds = p * (dp - dot_o[size_t(h)]) * scale;
          T* dk = grads[g].dk ? grads[g].dk + kv : nullptr;
          T* dv = grads[g].dv ? grads[g].dv + kv : nullptr;
          for (int d = 0; d < hd; ++d) {
            dqh[d] += ds * k[d];
            if (dk) dk[d] += ds * qh[d];
            if (dv) dv[d] += p * dh[d];
          }
        }
      }
      // Back through the segment's query rotation: the inverse rotation of the gradient.
      angles(int64_t(positions[i]) - seg.delta, inv_freq, true, c.data(), sn.data());
      for (int h = 0; h < s.n_heads; ++h) {
        T* dqh = dqs.data() + size_t(h) * hd;
        rotate(dqh, c.data(), sn.data(), s.rope);
        T* out = dq + (size_t(i) * s.n_heads + h) * hd;
        for (int d = 0; d < hd; ++d) out[d] += dqh[d];
      }
    }
  }
}

#define CHOREO_TRAIN_OPS(T)                                                                                      \
  template void rmsnorm_forward<T>(const T*, const float*, int, int, float, T*);                                \
  template void rmsnorm_backward<T>(const T*, const float*, int, int, float, const T*, T*, T*);                 \
  template void rope_rotate<T>(T*, int, int, int, const int32_t*, const kernels::RopeParams&, bool);            \
  template void swiglu_forward<T>(const T*, const T*, size_t, T*);                                              \
  template void swiglu_backward<T>(const T*, const T*, size_t, const T*, T*, T*);                               \
  template void linear_forward<T>(const LinearParams<T>&, const T*, int, T*, T*);                               \
  template void linear_backward<T>(const LinearParams<T>&, const T*, const T*, int, const T*, T*, T*, T*);      \
  template double cross_entropy<T>(const T*, int, int, const int32_t*, T*, double);                             \
  template void embedding_forward<T>(const float*, int, std::span<const int32_t>, T*);                          \
  template void embedding_backward<T>(int, std::span<const int32_t>, const T*, T*);                             \
  template void attention_forward<T>(const AttentionShape&, const T*, const int32_t*, int,                      \
                                     std::span<const Segment<T>>, T*, T*);                                      \
  template void attention_backward<T>(const AttentionShape&, const T*, const int32_t*, int,                     \
                                      std::span<const Segment<T>>, const T*, const T*, const T*, T*,            \
                                      std::span<const SegmentGrad<T>>);

CHOREO_TRAIN_OPS(float)
CHOREO_TRAIN_OPS(double)

}  // namespace choreo::train
