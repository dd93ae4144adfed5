// The backward pass of every op of fine-tuning (runtime/train/ops.h) against central finite differences of
// its forward pass in float64: for a random input x and a random upstream gradient G, the gradient of
// L(x) = sum(G * f(x)) that the op's backward gives must match (L(x + h e_k) - L(x - h e_k)) / 2h for every
// coordinate k. The float instantiation must agree with the double one. The segment attention's forward is
// also checked against a dense softmax over keys re-rotated to their placed positions (DESIGN.md §2: virtual
// repositioning gives the scores of rotating the keys).

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/train/ops.h"

namespace choreo {
namespace {

using train::AttentionShape;
using train::LinearParams;
using train::Segment;
using train::SegmentGrad;

std::vector<double> random_vector(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

std::vector<float> as_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Every coordinate of `grad` against central differences of `loss` in x (which loss reads).
void check_gradient(std::vector<double>& x, const std::vector<double>& grad, const std::function<double()>& loss,
                    const std::string& what) {
  REQUIRE(grad.size() == x.size());
  constexpr double h = 1e-6;
  double worst = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    const double keep = x[k];
    x[k] = keep + h;
    const double up = loss();
    x[k] = keep - h;
    const double down = loss();
    x[k] = keep;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(numeric - grad[k]) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
    CAPTURE(what);
    CAPTURE(k);
    CHECK_MESSAGE(err < 1e-6, "analytic ", grad[k], " numeric ", numeric);
  }
  MESSAGE(what, ": worst relative error ", worst, " over ", x.size(), " coordinates");
}

/// The largest |a - b| / max(1, |b|).
double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1.0, std::abs(b[i])));
  return worst;
}

TEST_CASE("train ops: RMSNorm's backward gives the gradients of x and of the weight") {
  std::mt19937_64 rng(1);
  const int rows = 3, dim = 8;
  std::vector<double> x = random_vector(rows * dim, rng), g = random_vector(rows * dim, rng);
  std::vector<double> wd = random_vector(dim, rng);
  std::vector<float> w = as_float(wd);
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = w[i];
  const float eps = 1e-5f;
  std::vector<double> y(x.size());
  const auto loss = [&] {
    train::rmsnorm_forward(x.data(), w.data(), rows, dim, eps, y.data());
    return dot(g, y);
  };
  std::vector<double> dx(x.size(), 0.0), dw(dim, 0.0);
  train::rmsnorm_backward(x.data(), w.data(), rows, dim, eps, g.data(), dx.data(), dw.data());
  check_gradient(x, dx, loss, "rmsnorm dx");
  // The weight is float in the op: differentiate through a double copy by hand-built forward.
  const auto loss_w = [&] {
    double l = 0;
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int k = 0; k < dim; ++k) ss += x[r * dim + k] * x[r * dim + k];
      const double inv = 1 / std::sqrt(ss / dim + double(eps));
      for (int k = 0; k < dim; ++k) l += g[r * dim + k] * x[r * dim + k] * inv * wd[k];
    }
    return l;
  };
  check_gradient(wd, dw, loss_w, "rmsnorm dw");
  // float agrees with double.
  std::vector<float> yf(x.size()), xf = as_float(x);
  train::rmsnorm_forward(xf.data(), w.data(), rows, dim, eps, yf.data());
  loss();
  CHECK(max_diff(yf, y) < 1e-5);
}

TEST_CASE("train ops: SwiGLU's backward gives the gradients of the gate and the up projection") {
  std::mt19937_64 rng(2);
  const size_t n = 12;
  std::vector<double> gate = random_vector(n, rng, 2.0), up = random_vector(n, rng), g = random_vector(n, rng);
  std::vector<double> h(n);
  const auto loss = [&] {
    train::swiglu_forward(gate.data(), up.data(), n, h.data());
    return dot(g, h);
  };
  std::vector<double> dgate(n, 0.0), dup(n, 0.0);
  train::swiglu_backward(gate.data(), up.data(), n, g.data(), dgate.data(), dup.data());
  check_gradient(gate, dgate, loss, "swiglu dgate");
  check_gradient(up, dup, loss, "swiglu dup");
}

TEST_CASE("train ops: RoPE is a rotation whose backward is the inverse rotation, in both layouts") {
  for (const auto layout : {kernels::RopeParams::Layout::Interleaved, kernels::RopeParams::Layout::Halves}) {
    std::mt19937_64 rng(3);
    const int rows = 3, heads = 2, hd = 8;
    const float factors[] = {1.0f, 2.0f, 4.0f, 8.0f};
    kernels::RopeParams p{layout, hd, 10000.0f, factors};
    const int32_t pos[] = {0, 7, 1234};
    std::vector<double> x = random_vector(rows * heads * hd, rng), g = random_vector(x.size(), rng);
    std::vector<double> y(x.size());
    const auto loss = [&] {
      y = x;
      train::rope_rotate(y.data(), rows, heads, hd, pos, p, false);
      return dot(g, y);
    };
    std::vector<double> dx = g;
    train::rope_rotate(dx.data(), rows, heads, hd, pos, p, true);
    check_gradient(x, dx, loss, "rope");
    // Rotating back gives x again; the rotation keeps norms.
    loss();
    std::vector<double> back = y;
    train::rope_rotate(back.data(), rows, heads, hd, pos, p, true);
    for (size_t i = 0; i < x.size(); ++i) CHECK(back[i] == doctest::Approx(x[i]).epsilon(1e-12));
    CHECK(dot(y, y) == doctest::Approx(dot(x, x)).epsilon(1e-12));
  }
}

TEST_CASE("train ops: a linear layer with LoRA gives the gradients of its input and of both LoRA matrices") {
  std::mt19937_64 rng(4);
  const int rows = 3, n_in = 6, n_out = 5, rank = 2;
  const std::vector<float> w = as_float(random_vector(size_t(n_in) * n_out, rng));
  std::vector<double> x = random_vector(size_t(rows) * n_in, rng), a = random_vector(size_t(rank) * n_in, rng),
                      b = random_vector(size_t(n_out) * rank, rng), g = random_vector(size_t(rows) * n_out, rng);
  LinearParams<double> p{w.data(), n_in, n_out, a.data(), b.data(), rank, 0.75f};
  std::vector<double> y(size_t(rows) * n_out), xa(size_t(rows) * rank);
  const auto loss = [&] {
    train::linear_forward(p, x.data(), rows, y.data(), xa.data());
    return dot(g, y);
  };
  loss();
  // The forward itself, against the definition.
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < n_out; ++o) {
      double want = 0;
      for (int i = 0; i < n_in; ++i) want += x[r * n_in + i] * double(w[size_t(o) * n_in + i]);
      for (int k = 0; k < rank; ++k) {
        double ax = 0;
        for (int i = 0; i < n_in; ++i) ax += a[k * n_in + i] * x[r * n_in + i];
        want += 0.75 * b[o * rank + k] * ax;
      }
      CHECK(y[r * n_out + o] == doctest::Approx(want).epsilon(1e-12));
    }
  std::vector<double> dx(x.size(), 0.0), da(a.size(), 0.0), db(b.size(), 0.0);
  train::linear_backward(p, x.data(), xa.data(), rows, g.data(), dx.data(), da.data(), db.data());
  check_gradient(x, dx, loss, "linear dx");
  check_gradient(a, da, loss, "lora dA");
  check_gradient(b, db, loss, "lora dB");
  // Without the pair: the same product, and only dx.
  LinearParams<double> plain{w.data(), n_in, n_out};
  std::vector<double> dx_plain(x.size(), 0.0);
  const auto loss_plain = [&] {
    train::linear_forward<double>(plain, x.data(), rows, y.data(), nullptr);
    return dot(g, y);
  };
  train::linear_backward<double>(plain, x.data(), nullptr, rows, g.data(), dx_plain.data(), nullptr, nullptr);
  check_gradient(x, dx_plain, loss_plain, "linear dx without LoRA");
}

TEST_CASE("train ops: cross-entropy's gradient is softmax minus the target, scaled") {
  std::mt19937_64 rng(5);
  const int rows = 3, vocab = 7;
  std::vector<double> logits = random_vector(size_t(rows) * vocab, rng, 3.0);
  const int32_t targets[] = {0, 6, 3};
  const auto loss = [&] { return 0.5 * train::cross_entropy<double>(logits.data(), rows, vocab, targets, nullptr); };
  std::vector<double> d(logits.size(), 0.0);
  const double l = train::cross_entropy(logits.data(), rows, vocab, targets, d.data(), 0.5);
  check_gradient(logits, d, loss, "cross-entropy");
  // The loss itself: -log softmax at the target, summed.
  double want = 0;
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    for (int k = 0; k < vocab; ++k) sum += std::exp(logits[r * vocab + k]);
    want += std::log(sum) - logits[r * vocab + targets[r]];
  }
  CHECK(l == doctest::Approx(want).epsilon(1e-12));
}

TEST_CASE("train ops: the embedding's backward adds each row's gradient to its token's row") {
  std::mt19937_64 rng(6);
  const int dim = 4, vocab = 5;
  const std::vector<float> table = as_float(random_vector(size_t(vocab) * dim, rng));
  const std::vector<int32_t> ids = {3, 1, 3};
  std::vector<double> out(ids.size() * dim);
  train::embedding_forward(table.data(), dim, ids, out.data());
  for (size_t r = 0; r < ids.size(); ++r)
    for (int k = 0; k < dim; ++k) CHECK(out[r * dim + k] == double(table[size_t(ids[r]) * dim + k]));
  std::vector<double> g = random_vector(out.size(), rng), dtable(table.size(), 0.0);
  train::embedding_backward(dim, ids, g.data(), dtable.data());
  for (int k = 0; k < dim; ++k) {
    CHECK(dtable[3 * dim + k] == doctest::Approx(g[k] + g[2 * dim + k]));
    CHECK(dtable[1 * dim + k] == g[dim + k]);
    CHECK(dtable[0 * dim + k] == 0.0);
  }
}

/// Segment attention of a call with three query rows over: a parent placed 5 positions after where it was
/// encoded, the same parent again at another placement (overlapping parents), and the call's own keys
/// (causal). GQA: 4 query heads over 2 KV heads.
struct AttentionCase {
  AttentionShape shape;
  int rows = 3, parent_tokens = 4;
  std::vector<int32_t> positions = {9, 10, 11};
  std::vector<double> q, parent_k, parent_v, own_k, own_v, g;
  explicit AttentionCase(kernels::RopeParams::Layout layout, std::mt19937_64& rng) {
    shape = {4, 2, 8, {layout, 8, 10000.0f, nullptr}};
    const int kv_dim = shape.n_kv_heads * shape.head_dim;
    q = random_vector(size_t(rows) * shape.n_heads * shape.head_dim, rng);
    parent_k = random_vector(size_t(parent_tokens) * kv_dim, rng);
    parent_v = random_vector(parent_k.size(), rng);
    own_k = random_vector(size_t(rows) * kv_dim, rng);
    own_v = random_vector(own_k.size(), rng);
    g = random_vector(q.size(), rng);
  }
  std::vector<Segment<double>> segments() const {
    // The parent at delta 5 (positions 6..9) and at delta 2 (3..6); the own keys at 9..11, causal.
    return {{parent_k.data(), parent_v.data(), parent_tokens, 5, -1},
            {parent_k.data(), parent_v.data(), parent_tokens, 2, -1},
            {own_k.data(), own_v.data(), rows, 0, 0}};
  }
  std::vector<double> forward(std::vector<double>* lse_out = nullptr) const {
    std::vector<double> o(q.size()), lse(size_t(rows) * shape.n_heads);
    const std::vector<Segment<double>> segs = segments();
    train::attention_forward<double>(shape, q.data(), positions.data(), rows, segs, o.data(), lse.data());
    if (lse_out) *lse_out = lse;
    return o;
  }
};

TEST_CASE("train ops: segment attention equals a dense softmax over keys re-rotated to their placements") {
  for (const auto layout : {kernels::RopeParams::Layout::Interleaved, kernels::RopeParams::Layout::Halves}) {
    std::mt19937_64 rng(7);
    const AttentionCase c(layout, rng);
    const std::vector<double> o = c.forward();
    const AttentionShape& s = c.shape;
    const int hd = s.head_dim, kv_dim = s.n_kv_heads * hd;
    // The keys as the paper's destructive re-rotation would store them: rotated by each placement's delta.
    const auto placed = [&](const std::vector<double>& k, int n, int delta) {
      std::vector<double> out = k;
      std::vector<int32_t> d(size_t(n), delta);
      train::rope_rotate(out.data(), n, s.n_kv_heads, hd, d.data(), s.rope, false);
      return out;
    };
    const std::vector<double> k5 = placed(c.parent_k, c.parent_tokens, 5), k2 = placed(c.parent_k, c.parent_tokens, 2);
    std::vector<double> qr = c.q;
    train::rope_rotate(qr.data(), c.rows, s.n_heads, hd, c.positions.data(), s.rope, false);
    for (int i = 0; i < c.rows; ++i)
      for (int h = 0; h < s.n_heads; ++h) {
        const double* qh = qr.data() + (size_t(i) * s.n_heads + h) * hd;
        std::vector<std::pair<double, const double*>> keys;  // (score, value row)
        const auto add = [&](const std::vector<double>& k, const std::vector<double>& v, int j) {
          const size_t at = size_t(j) * kv_dim + size_t(h / 2) * hd;
          double sc = 0;
          for (int d = 0; d < hd; ++d) sc += qh[d] * k[at + d];
          keys.push_back({sc / std::sqrt(double(hd)), v.data() + at});
        };
        for (int j = 0; j < c.parent_tokens; ++j) add(k5, c.parent_v, j);
        for (int j = 0; j < c.parent_tokens; ++j) add(k2, c.parent_v, j);
        for (int j = 0; j <= i; ++j) add(c.own_k, c.own_v, j);
        double m = -1e300, sum = 0;
        for (const auto& [sc, v] : keys) m = std::max(m, sc);
        std::vector<double> want(size_t(hd), 0.0);
        for (const auto& [sc, v] : keys) {
          const double p = std::exp(sc - m);
          sum += p;
          for (int d = 0; d < hd; ++d) want[size_t(d)] += p * v[d];
        }
        for (int d = 0; d < hd; ++d)
          CHECK(o[(size_t(i) * s.n_heads + h) * hd + d] == doctest::Approx(want[size_t(d)] / sum).epsilon(1e-10));
      }
  }
}

TEST_CASE("train ops: segment attention's backward gives the gradients of the queries and of every segment's keys and values") {
  for (const auto layout : {kernels::RopeParams::Layout::Interleaved, kernels::RopeParams::Layout::Halves}) {
    std::mt19937_64 rng(8);
    AttentionCase c(layout, rng);
    const auto loss = [&] { return dot(c.g, c.forward()); };
    std::vector<double> lse;
    const std::vector<double> o = c.forward(&lse);
    std::vector<double> dq(c.q.size(), 0.0), dpk(c.parent_k.size(), 0.0), dpv(c.parent_v.size(), 0.0),
        dok(c.own_k.size(), 0.0), dov(c.own_v.size(), 0.0);
    // Both placements of the parent add into its one gradient.
    const std::vector<SegmentGrad<double>> grads = {{dpk.data(), dpv.data()}, {dpk.data(), dpv.data()},
                                                    {dok.data(), dov.data()}};
    const std::vector<Segment<double>> segs = c.segments();
    train::attention_backward<double>(c.shape, c.q.data(), c.positions.data(), c.rows, segs, o.data(), lse.data(),
                                      c.g.data(), dq.data(), grads);
    check_gradient(c.q, dq, loss, "attention dq");
    check_gradient(c.parent_k, dpk, loss, "attention d(parent K)");
    check_gradient(c.parent_v, dpv, loss, "attention d(parent V)");
    check_gradient(c.own_k, dok, loss, "attention d(own K)");
    check_gradient(c.own_v, dov, loss, "attention d(own V)");
    // float agrees with double.
    const std::vector<float> qf = as_float(c.q), pkf = as_float(c.parent_k), pvf = as_float(c.parent_v),
                             okf = as_float(c.own_k), ovf = as_float(c.own_v);
    const std::vector<Segment<float>> fsegs = {{pkf.data(), pvf.data(), c.parent_tokens, 5, -1},
                                               {pkf.data(), pvf.data(), c.parent_tokens, 2, -1},
                                               {okf.data(), ovf.data(), c.rows, 0, 0}};
    std::vector<float> of(o.size()), lsef(lse.size());
    train::attention_forward<float>(c.shape, qf.data(), c.positions.data(), c.rows, fsegs, of.data(), lsef.data());
    CHECK(max_diff(of, o) < 1e-5);
  }
}

}  // namespace
}  // namespace choreo
