#include "runtime/train/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace choreo::train {

namespace {

/// c = alpha op(a) op(b) + beta c over strided row-major matrices (the heads of a row of many heads).
template <class T>
void gemm_ld(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta,
             T* c, int ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS would reject the leading dimensions of an empty operand
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[size_t(i) * ldc + j] = beta == T(0) ? T(0) : beta * c[size_t(i) * ldc + j];
    return;
  }
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// c (m x n) = alpha op(a) op(b) + beta c, row-major and contiguous; op(a) is m x k, op(b) k x n.
template <class T>
void gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, const T* b, T beta, T* c) {
  gemm_ld<T>(ta, tb, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
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

namespace {

/// Where head h's KV head starts in a row of keys or values (grouped-query heads share one).
size_t kv_offset(const AttentionShape& s, int h) { return size_t(h / (s.n_heads / s.n_kv_heads)) * size_t(s.head_dim); }

/// One attention call laid out for matrix products: each segment's queries rotated for its placement (rows x
/// n_heads * head_dim; segments placed at the same delta share one copy), and the columns each segment
/// takes in a row of scores (only the keys some row can see).
template <class T>
struct AttentionPlan {
  std::vector<int> deltas;               // the distinct placements
  std::vector<std::vector<T>> rotated;  // the queries rotated for each
  std::vector<size_t> query_of;         // segment -> index into rotated
  std::vector<int> width, offset;       // segment -> visible columns, first column
  int total = 0;

  AttentionPlan(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                std::span<const Segment<T>> segments) {
    const int hd = s.head_dim, qdim = s.n_heads * hd;
    const std::vector<double> inv_freq = inverse_frequencies(s.rope);
    std::vector<T> c(inv_freq.size()), sn(inv_freq.size());
    for (const Segment<T>& seg : segments) {
      const auto it = std::find(deltas.begin(), deltas.end(), seg.delta);
      query_of.push_back(size_t(it - deltas.begin()));
      if (it == deltas.end()) {
        deltas.push_back(seg.delta);
        std::vector<T>& r = rotated.emplace_back(q, q + size_t(rows) * qdim);
        for (int i = 0; i < rows; ++i) {
          angles(int64_t(positions[i]) - seg.delta, inv_freq, false, c.data(), sn.data());
          for (int h = 0; h < s.n_heads; ++h) rotate(r.data() + size_t(i) * qdim + size_t(h) * hd, c.data(), sn.data(), s.rope);
        }
      }
      width.push_back(rows == 0 ? 0 : visible(seg, rows - 1));
      offset.push_back(total);
      total += width.back();
    }
  }

  /// p (rows x total) = softmax probabilities of head h, from scores already in p: invisible columns become
  /// 0. With `lse_in`, the probabilities come from the forward's log-sum-exp; otherwise they are computed and
  /// lse_out receives them.
  void softmax(std::span<const Segment<T>> segments, int rows, int n_heads, int h, T* p, const T* lse_in,
               T* lse_out) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    for (int i = 0; i < rows; ++i) {
      T* row = p + size_t(i) * total;
      T m = kNegInf;
      if (lse_in) {
        m = lse_in[size_t(i) * n_heads + h];
      } else {
        for (size_t g = 0; g < segments.size(); ++g) {
          const int n = visible(segments[g], i);
          for (int j = 0; j < n; ++j) m = std::max(m, row[offset[g] + j]);
        }
      }
      T sum = 0;
      for (size_t g = 0; g < segments.size(); ++g) {
        const int n = m == kNegInf ? 0 : visible(segments[g], i);
        T* cols = row + offset[g];
        for (int j = 0; j < n; ++j) {
          cols[j] = std::exp(cols[j] - m);
          sum += cols[j];
        }
        std::fill(cols + n, cols + width[g], T(0));
      }
      if (lse_in || m == kNegInf) {
        if (lse_out) lse_out[size_t(i) * n_heads + h] = m;
        continue;
      }
      const T inv = T(1) / sum;
      for (int k = 0; k < total; ++k) row[k] *= inv;
      lse_out[size_t(i) * n_heads + h] = m + std::log(sum);
    }
  }

  /// The scores of head h against every segment's visible keys: p (rows x total) = q_rot k^T / sqrt(hd).
  void scores(const AttentionShape& s, std::span<const Segment<T>> segments, int rows, int h, T* p) const {
    const int hd = s.head_dim, qdim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
    const size_t kv_off = kv_offset(s, h);
    const T scale = T(1) / std::sqrt(T(hd));
    for (size_t g = 0; g < segments.size(); ++g)
      gemm_ld<T>(false, true, rows, width[g], hd, scale, rotated[query_of[g]].data() + size_t(h) * hd, qdim,
                 segments[g].k + kv_off, kv_dim, T(0), p + offset[g], total);
  }
};

}  // namespace

template <class T>
void attention_forward(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                       std::span<const Segment<T>> segments, T* o, T* lse) {
  const int hd = s.head_dim, qdim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const AttentionPlan<T> plan(s, q, positions, rows, segments);
  std::vector<T> p(size_t(rows) * plan.total);
  std::fill(o, o + size_t(rows) * qdim, T(0));
  for (int h = 0; h < s.n_heads; ++h) {
    const size_t kv_off = kv_offset(s, h);
    plan.scores(s, segments, rows, h, p.data());
    plan.softmax(segments, rows, s.n_heads, h, p.data(), nullptr, lse);
    for (size_t g = 0; g < segments.size(); ++g)
      gemm_ld<T>(false, false, rows, hd, plan.width[g], T(1), p.data() + plan.offset[g], plan.total,
                 segments[g].v + kv_off, kv_dim, T(1), o + size_t(h) * hd, qdim);
  }
}

template <class T>
void attention_backward(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                        std::span<const Segment<T>> segments, const T* o, const T* lse, const T* dout, T* dq,
                        std::span<const SegmentGrad<T>> grads) {
  const int hd = s.head_dim, qdim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const T scale = T(1) / std::sqrt(T(hd));
  const AttentionPlan<T> plan(s, q, positions, rows, segments);
  std::vector<T> p(size_t(rows) * plan.total), ds(size_t(rows) * plan.total), dot_o(static_cast<size_t>(rows));
  // The gradient of each distinct rotation of the queries.
  std::vector<std::vector<T>> dq_rot(plan.rotated.size(), std::vector<T>(size_t(rows) * qdim, T(0)));
  for (int h = 0; h < s.n_heads; ++h) {
    const size_t kv_off = kv_offset(s, h);
    for (int i = 0; i < rows; ++i) {
      const T* oh = o + size_t(i) * qdim + size_t(h) * hd;
      const T* dh = dout + size_t(i) * qdim + size_t(h) * hd;
      T dot = 0;
      for (int d = 0; d < hd; ++d) dot += oh[d] * dh[d];
      dot_o[size_t(i)] = dot;
    }
    plan.scores(s, segments, rows, h, p.data());
    plan.softmax(segments, rows, s.n_heads, h, p.data(), lse, nullptr);
    // dP = dO v^T, then dS = P (dP - o.dO) / sqrt(hd).
    for (size_t g = 0; g < segments.size(); ++g)
      gemm_ld<T>(false, true, rows, plan.width[g], hd, T(1), dout + size_t(h) * hd, qdim, segments[g].v + kv_off,
                 kv_dim, T(0), ds.data() + plan.offset[g], plan.total);
    for (int i = 0; i < rows; ++i) {
      const T* pr = p.data() + size_t(i) * plan.total;
      T* dr = ds.data() + size_t(i) * plan.total;
      for (int k = 0; k < plan.total; ++k) dr[k] = pr[k] * (dr[k] - dot_o[size_t(i)]) * scale;
    }
    for (size_t g = 0; g < segments.size(); ++g) {
      const int n = plan.width[g];
      const T* pg = p.data() + plan.offset[g];
      const T* dsg = ds.data() + plan.offset[g];
      const T* qg = plan.rotated[plan.query_of[g]].data() + size_t(h) * hd;
      gemm_ld<T>(false, false, rows, hd, n, T(1), dsg, plan.total, segments[g].k + kv_off, kv_dim, T(1),
                 dq_rot[plan.query_of[g]].data() + size_t(h) * hd, qdim);
      if (grads[g].dk)
        gemm_ld<T>(true, false, n, hd, rows, T(1), dsg, plan.total, qg, qdim, T(1), grads[g].dk + kv_off, kv_dim);
      if (grads[g].dv)
        gemm_ld<T>(true, false, n, hd, rows, T(1), pg, plan.total, dout + size_t(h) * hd, qdim, T(1),
                   grads[g].dv + kv_off, kv_dim);
    }
  }
  // Back through each placement's query rotation: the inverse rotation of the gradient.
  const std::vector<double> inv_freq = inverse_frequencies(s.rope);
  std::vector<T> c(inv_freq.size()), sn(inv_freq.size());
  for (size_t r = 0; r < dq_rot.size(); ++r) {
    for (int i = 0; i < rows; ++i) {
      angles(int64_t(positions[i]) - plan.deltas[r], inv_freq, true, c.data(), sn.data());
      for (int h = 0; h < s.n_heads; ++h) {
        T* dqh = dq_rot[r].data() + size_t(i) * qdim + size_t(h) * hd;
        rotate(dqh, c.data(), sn.data(), s.rope);
        T* out = dq + size_t(i) * qdim + size_t(h) * hd;
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
