#include "runtime/train/graph.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "common/error.h"
#include "kernels/quant.h"

namespace choreo::train {

namespace {

std::vector<float> dequantise_weight(const kernels::Weight& w) {
  std::vector<float> out(size_t(w.n_out) * size_t(w.n_in));
  for (int64_t r = 0; r < w.n_out; ++r)
    kernels::dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_stride,
                            out.data() + size_t(r) * size_t(w.n_in), w.n_in);
  return out;
}

}  // namespace

FrozenModel FrozenModel::dequantise(const model::Model& m) {
  FrozenModel f;
  f.config = m.config();
  f.rope = m.rope_params();
  if (f.rope.freq_factors) f.rope_factors.assign(f.rope.freq_factors, f.rope.freq_factors + f.rope.n_dims / 2);
  f.rope.freq_factors = nullptr;
  f.token_embd = dequantise_weight(m.token_embedding());
  f.output = dequantise_weight(m.output_weight());
  f.output_norm = m.output_norm();
  for (int l = 0; l < f.config.n_layers; ++l) {
    const model::LayerWeights& L = m.layer(l);
    Layer out;
    out.attn_norm = L.attn_norm;
    out.ffn_norm = L.ffn_norm;
    const kernels::Weight* w[kLayerTargets] = {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
    for (int t = 0; t < kLayerTargets; ++t) out.w[size_t(t)] = dequantise_weight(*w[t]);
    f.layers.push_back(std::move(out));
  }
  return f;
}

std::pair<int, int> FrozenModel::shape(model::LoraTarget t) const {
  const model::LlamaConfig& c = config;
  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  switch (t) {
    case model::LoraTarget::Q: return {c.dim, q_dim};
    case model::LoraTarget::K:
    case model::LoraTarget::V: return {c.dim, kv_dim};
    case model::LoraTarget::O: return {q_dim, c.dim};
    case model::LoraTarget::Gate:
    case model::LoraTarget::Up: return {c.dim, c.ffn_dim};
    case model::LoraTarget::Down: return {c.ffn_dim, c.dim};
    case model::LoraTarget::Output: return {c.dim, c.n_vocab};
  }
  return {0, 0};
}

template <class T>
LoraParams<T> LoraParams<T>::init(const FrozenModel& m, const std::vector<model::LoraTarget>& targets, int rank,
                                  float alpha, uint64_t seed, int first_layer, int end_layer) {
  if (rank < 1) throw InputError(fmt::format("LoRA rank {} is not positive", rank), "give --rank 1 or more");
  if (end_layer < 0) end_layer = m.config.n_layers;
  if (first_layer < 0 || first_layer >= end_layer || end_layer > m.config.n_layers)
    throw InputError(fmt::format("LoRA layers [{}, {}) are not within the model's {} layers", first_layer, end_layer,
                                 m.config.n_layers));
  LoraParams p;
  p.rank = rank;
  p.alpha = alpha;
  p.layers.resize(size_t(m.config.n_layers));
  std::mt19937_64 rng(seed);
  const auto pair = [&](model::LoraTarget t) {
    const auto [n_in, n_out] = m.shape(t);
    Pair out{n_in, n_out, std::vector<T>(size_t(rank) * n_in), std::vector<T>(size_t(n_out) * rank, T(0))};
    std::uniform_real_distribution<double> u(-1.0 / std::sqrt(double(n_in)), 1.0 / std::sqrt(double(n_in)));
    for (T& a : out.a) a = T(u(rng));
    return out;
  };
  for (int l = first_layer; l < end_layer; ++l)
    for (model::LoraTarget t : targets)
      if (t != model::LoraTarget::Output) p.layers[size_t(l)][size_t(t)] = pair(t);
  if (std::find(targets.begin(), targets.end(), model::LoraTarget::Output) != targets.end())
    p.output = pair(model::LoraTarget::Output);
  return p;
}

template <class T>
int LoraParams<T>::lowest_layer() const {
  for (size_t l = 0; l < layers.size(); ++l)
    for (const std::optional<Pair>& p : layers[l])
      if (p) return int(l);
  return int(layers.size());
}

template <class T>
LoraParams<T> LoraParams<T>::zeros_like() const {
  LoraParams z = *this;
  for (T* v : z.values()) *v = T(0);
  return z;
}

template <class T>
std::vector<T*> LoraParams<T>::values() {
  std::vector<T*> out;
  const auto add = [&](std::optional<Pair>& p) {
    if (!p) return;
    for (T& a : p->a) out.push_back(&a);
    for (T& b : p->b) out.push_back(&b);
  };
  for (auto& layer : layers)
    for (auto& p : layer) add(p);
  add(output);
  return out;
}

template <class T>
size_t LoraParams<T>::size() const {
  size_t n = 0;
  const auto add = [&](const std::optional<Pair>& p) { n += p ? p->a.size() + p->b.size() : 0; };
  for (const auto& layer : layers)
    for (const auto& p : layer) add(p);
  add(output);
  return n;
}

namespace {

/// The linear map of `t` in layer `l` (layer -1: the output projection), with its LoRA pair when the message
/// uses the adapter and the pair exists; `pair` receives the pair's index for the gradients.
template <class T>
LinearParams<T> linear_of(const FrozenModel& m, const LoraParams<T>& lora, bool use_lora, int l,
                          model::LoraTarget t) {
  const auto [n_in, n_out] = m.shape(t);
  LinearParams<T> p;
  p.w = l < 0 ? m.output.data() : m.layers[size_t(l)].w[size_t(t)].data();
  p.n_in = n_in;
  p.n_out = n_out;
  const std::optional<typename LoraParams<T>::Pair>* pair =
      l < 0 ? &lora.output : (lora.layers.empty() ? nullptr : &lora.layers[size_t(l)][size_t(t)]);
  if (use_lora && pair && *pair) {
    p.a = (*pair)->a.data();
    p.b = (*pair)->b.data();
    p.rank = lora.rank;
    p.scale = lora.scale();
  }
  return p;
}

template <class T>
std::pair<T*, T*> grads_of(LoraParams<T>& grads, int l, model::LoraTarget t) {
  std::optional<typename LoraParams<T>::Pair>* pair =
      l < 0 ? &grads.output : (grads.layers.empty() ? nullptr : &grads.layers[size_t(l)][size_t(t)]);
  if (!pair || !*pair) return {nullptr, nullptr};
  return {(*pair)->a.data(), (*pair)->b.data()};
}

/// The rows of a message with a target, and the targets.
std::pair<std::vector<int>, std::vector<int32_t>> target_rows(const GraphMessage& m) {
  std::pair<std::vector<int>, std::vector<int32_t>> out;
  for (size_t r = 0; r < m.targets.size(); ++r)
    if (m.targets[r] >= 0) {
      out.first.push_back(int(r));
      out.second.push_back(m.targets[r]);
    }
  return out;
}

}  // namespace

template <class T>
int Graph<T>::add(GraphMessage m) {
  const int n_vocab = model_.config.n_vocab;
  if (m.tokens.empty()) throw InputError("a training message has no tokens");
  if (!m.targets.empty() && m.targets.size() != m.tokens.size())
    throw InputError("a training message has another number of targets than tokens");
  if (m.targets.empty()) m.targets.assign(m.tokens.size(), -1);
  for (int32_t t : m.tokens)
    if (t < 0 || t >= n_vocab) throw InputError(fmt::format("token {} is outside the vocabulary", t));
  for (int32_t t : m.targets)
    if (t >= n_vocab) throw InputError(fmt::format("target {} is outside the vocabulary", t));
  for (GraphMessage::Parent& p : m.parents) {
    if (p.message < 0 || p.message >= int(messages_.size()))
      throw InputError(fmt::format("parent {} is not an earlier message", p.message));
    const int n = int(messages_[size_t(p.message)].tokens.size());
    if (p.n_tokens < 0) p.n_tokens = n;
    if (p.n_tokens > n) throw InputError(fmt::format("parent {} has fewer than {} tokens", p.message, p.n_tokens));
  }
  messages_.push_back(std::move(m));
  return int(messages_.size()) - 1;
}

template <class T>
int Graph<T>::n_targets() const {
  int n = 0;
  for (const GraphMessage& m : messages_) n += int(target_rows(m).first.size());
  return n;
}

template <class T>
std::vector<Segment<T>> Graph<T>::segments(size_t i, int layer) const {
  std::vector<Segment<T>> out;
  for (const GraphMessage::Parent& p : messages_[i].parents) {
    const LayerActs& a = acts_[size_t(p.message)].layers[size_t(layer)];
    out.push_back({a.k.data(), a.v.data(), p.n_tokens, p.offset - messages_[size_t(p.message)].start_pos, -1});
  }
  const LayerActs& own = acts_[i].layers[size_t(layer)];
  out.push_back({own.k.data(), own.v.data(), int(messages_[i].tokens.size()), 0, 0});
  return out;
}

template <class T>
void Graph<T>::layer_forward(size_t i, int l, LayerActs& a, std::vector<T>& x) const {
  const model::LlamaConfig& c = model_.config;
  const kernels::RopeParams rope = model_.rope_params();
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, rope};
  const size_t q_dim = size_t(c.n_heads) * c.head_dim, ffn = size_t(c.ffn_dim);
  const GraphMessage& m = messages_[i];
  const Acts& acts = acts_[i];
  const int n = int(m.tokens.size());
  const FrozenModel::Layer& L = model_.layers[size_t(l)];
  const auto run = [&](model::LoraTarget t, const T* in, std::vector<T>& out) {
    const LinearParams<T> p = linear_of(model_, lora_, m.lora, l, t);
    out.assign(size_t(n) * size_t(p.n_out), T(0));
    std::vector<T>& xa = a.xa[size_t(t)];
    xa.assign(p.rank ? size_t(n) * size_t(p.rank) : 0, T(0));
    linear_forward(p, in, n, out.data(), p.rank ? xa.data() : nullptr);
  };
  a.xn.resize(x.size());
  rmsnorm_forward(x.data(), L.attn_norm.data(), n, c.dim, c.rms_eps, a.xn.data());
  run(model::LoraTarget::Q, a.xn.data(), a.q);
  run(model::LoraTarget::K, a.xn.data(), a.k);
  run(model::LoraTarget::V, a.xn.data(), a.v);
  rope_rotate(a.k.data(), n, c.n_kv_heads, c.head_dim, acts.positions.data(), rope, false);
  a.att.assign(size_t(n) * q_dim, T(0));
  a.lse.assign(size_t(n) * c.n_heads, T(0));
  const std::vector<Segment<T>> segs = segments(i, l);
  attention_forward<T>(shape, a.q.data(), acts.positions.data(), n, segs, a.att.data(), a.lse.data());
  std::vector<T> o;
  run(model::LoraTarget::O, a.att.data(), o);
  for (size_t k = 0; k < x.size(); ++k) x[k] += o[k];
  a.x_mid = x;
  a.xn2.resize(x.size());
  rmsnorm_forward(x.data(), L.ffn_norm.data(), n, c.dim, c.rms_eps, a.xn2.data());
  run(model::LoraTarget::Gate, a.xn2.data(), a.g);
  run(model::LoraTarget::Up, a.xn2.data(), a.u);
  a.h.resize(size_t(n) * ffn);
  swiglu_forward(a.g.data(), a.u.data(), a.h.size(), a.h.data());
  std::vector<T> d;
  run(model::LoraTarget::Down, a.h.data(), d);
  for (size_t k = 0; k < x.size(); ++k) x[k] += d[k];
}

template <class T>
void Graph<T>::LayerActs::drop_intermediates() {
  for (std::vector<T>* v : {&xn, &q, &att, &lse, &x_mid, &xn2, &g, &u, &h}) std::vector<T>().swap(*v);
  for (std::vector<T>& v : xa) std::vector<T>().swap(v);
}

template <class T>
size_t Graph<T>::activation_bytes(const FrozenModel& model, int rank, size_t tokens, bool recompute) {
  const model::LlamaConfig& c = model.config;
  const size_t dim = size_t(c.dim), q_dim = size_t(c.n_heads) * c.head_dim, kv_dim = size_t(c.n_kv_heads) * c.head_dim;
  // Always: the layer's input, k and v (later messages read them) and their gradients.
  size_t per_layer = dim + 4 * kv_dim;
  if (!recompute)
    per_layer += 3 * dim + 2 * q_dim + size_t(c.n_heads) + 3 * size_t(c.ffn_dim) + size_t(kLayerTargets) * size_t(rank);
  return tokens * (per_layer * size_t(c.n_layers) + dim) * sizeof(T);
}

template <class T>
double Graph<T>::forward() {
  const model::LlamaConfig& c = model_.config;
  const size_t dim = size_t(c.dim), kv_dim = size_t(c.n_kv_heads) * c.head_dim;
  acts_.assign(messages_.size(), {});
  double loss = 0;
  for (size_t i = 0; i < messages_.size(); ++i) {
    const GraphMessage& m = messages_[i];
    const int n = int(m.tokens.size());
    Acts& acts = acts_[i];
    acts.positions.resize(size_t(n));
    for (int r = 0; r < n; ++r) acts.positions[size_t(r)] = m.start_pos + r;
    std::vector<T> x(size_t(n) * dim);
    embedding_forward<T>(model_.token_embd.data(), c.dim, m.tokens, x.data());
    acts.layers.resize(size_t(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l) {
      LayerActs& a = acts.layers[size_t(l)];
      a.x_in = x;
      a.dk.assign(size_t(n) * kv_dim, T(0));
      a.dv.assign(size_t(n) * kv_dim, T(0));
      layer_forward(i, l, a, x);
      if (recompute_) a.drop_intermediates();
    }
    acts.x_final = std::move(x);
    const auto [rows, targets] = target_rows(m);
    if (rows.empty()) continue;
    std::vector<T> xt(rows.size() * dim), xn(rows.size() * dim);
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(acts.x_final.begin() + std::ptrdiff_t(size_t(rows[r]) * dim), dim, xt.begin() + std::ptrdiff_t(r * dim));
    rmsnorm_forward(xt.data(), model_.output_norm.data(), int(rows.size()), c.dim, c.rms_eps, xn.data());
    const LinearParams<T> p = linear_of(model_, lora_, m.lora, -1, model::LoraTarget::Output);
    std::vector<T> logits(rows.size() * size_t(c.n_vocab)), xa(p.rank ? rows.size() * size_t(p.rank) : 0);
    linear_forward(p, xn.data(), int(rows.size()), logits.data(), p.rank ? xa.data() : nullptr);
    loss += cross_entropy(logits.data(), int(rows.size()), c.n_vocab, targets.data(), static_cast<T*>(nullptr));
  }
  return loss;
}

template <class T>
void Graph<T>::backward(LoraParams<T>& grads) {
  const model::LlamaConfig& c = model_.config;
  const kernels::RopeParams rope = model_.rope_params();
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, rope};
  const size_t dim = size_t(c.dim), q_dim = size_t(c.n_heads) * c.head_dim, ffn = size_t(c.ffn_dim);
  if (acts_.size() != messages_.size()) throw std::logic_error("train::Graph::backward before forward");
  const int lowest = lora_.lowest_layer();
  for (size_t i = messages_.size(); i-- > 0;) {
    const GraphMessage& m = messages_[i];
    const int n = int(m.tokens.size());
    Acts& acts = acts_[i];
    std::vector<T> dx(size_t(n) * dim, T(0));
    const auto back = [&](const LayerActs* a, int l, model::LoraTarget t, const T* in, int rows, const T* dy, T* din) {
      const LinearParams<T> p = linear_of(model_, lora_, m.lora, l, t);
      const auto [da, db] = p.rank ? grads_of(grads, l, t) : std::pair<T*, T*>{nullptr, nullptr};
      const T* xa = p.rank ? (a ? a->xa[size_t(t)].data() : nullptr) : nullptr;
      std::vector<T> xa_local;
      if (p.rank && !a) {  // the output projection: x A^T again
        xa_local.resize(size_t(rows) * size_t(p.rank));
        std::vector<T> y(size_t(rows) * size_t(p.n_out));
        linear_forward(p, in, rows, y.data(), xa_local.data());
        xa = xa_local.data();
      }
      linear_backward(p, in, xa, rows, dy, din, da, db);
    };
    // The loss at the output: logits again for the target rows, then their gradient down to x_final.
    const auto [rows, targets] = target_rows(m);
    if (!rows.empty()) {
      const size_t nt = rows.size();
      std::vector<T> xt(nt * dim), xn(nt * dim), dxn(nt * dim, T(0)), dxt(nt * dim, T(0));
      for (size_t r = 0; r < nt; ++r)
        std::copy_n(acts.x_final.begin() + std::ptrdiff_t(size_t(rows[r]) * dim), dim, xt.begin() + std::ptrdiff_t(r * dim));
      rmsnorm_forward(xt.data(), model_.output_norm.data(), int(nt), c.dim, c.rms_eps, xn.data());
      const LinearParams<T> p = linear_of(model_, lora_, m.lora, -1, model::LoraTarget::Output);
      std::vector<T> logits(nt * size_t(c.n_vocab)), xa(p.rank ? nt * size_t(p.rank) : 0);
      linear_forward(p, xn.data(), int(nt), logits.data(), p.rank ? xa.data() : nullptr);
      std::vector<T> dlogits(logits.size(), T(0));
      cross_entropy(logits.data(), int(nt), c.n_vocab, targets.data(), dlogits.data());
      const auto [da, db] = p.rank ? grads_of(grads, -1, model::LoraTarget::Output) : std::pair<T*, T*>{nullptr, nullptr};
      linear_backward(p, xn.data(), p.rank ? xa.data() : nullptr, int(nt), dlogits.data(), dxn.data(), da, db);
      rmsnorm_backward(xt.data(), model_.output_norm.data(), int(nt), c.dim, c.rms_eps, dxn.data(), dxt.data(),
                       static_cast<T*>(nullptr));
      for (size_t r = 0; r < nt; ++r)
        for (size_t k = 0; k < dim; ++k) dx[size_t(rows[r]) * dim + k] += dxt[r * dim + k];
    }
    // Layers below the lowest adapted one hold nothing to train: their gradients are not needed.
    for (int l = c.n_layers - 1; l >= lowest; --l) {
      LayerActs& a = acts.layers[size_t(l)];
      const FrozenModel::Layer& L = model_.layers[size_t(l)];
      if (recompute_) {  // the layer's intermediates again, from its input (the same bits as the forward's)
        std::vector<T> x = a.x_in;
        layer_forward(i, l, a, x);
      }
      // Feed-forward: x_out = x_mid + down(swiglu(gate(xn2), up(xn2))).
      std::vector<T> dh(size_t(n) * ffn, T(0)), dg(dh.size(), T(0)), du(dh.size(), T(0)), dxn2(dx.size(), T(0));
      back(&a, l, model::LoraTarget::Down, a.h.data(), n, dx.data(), dh.data());
      swiglu_backward(a.g.data(), a.u.data(), dh.size(), dh.data(), dg.data(), du.data());
      back(&a, l, model::LoraTarget::Gate, a.xn2.data(), n, dg.data(), dxn2.data());
      back(&a, l, model::LoraTarget::Up, a.xn2.data(), n, du.data(), dxn2.data());
      rmsnorm_backward(a.x_mid.data(), L.ffn_norm.data(), n, c.dim, c.rms_eps, dxn2.data(), dx.data(),
                       static_cast<T*>(nullptr));
      // Attention: x_mid = x_in + o(attention(q, every segment)).
      std::vector<T> datt(size_t(n) * q_dim, T(0)), dq(datt.size(), T(0));
      back(&a, l, model::LoraTarget::O, a.att.data(), n, dx.data(), datt.data());
      const std::vector<Segment<T>> segs = segments(i, l);
      std::vector<SegmentGrad<T>> sgrads;
      for (const GraphMessage::Parent& p : m.parents) {
        LayerActs& pa = acts_[size_t(p.message)].layers[size_t(l)];
        sgrads.push_back({pa.dk.data(), pa.dv.data()});
      }
      sgrads.push_back({a.dk.data(), a.dv.data()});
      attention_backward<T>(shape, a.q.data(), acts.positions.data(), n, segs, a.att.data(), a.lse.data(),
                            datt.data(), dq.data(), sgrads);
      // Every reader of this message's keys and values has added its gradient by now (later messages ran
      // their backward first, and this message's own attention just did).
      rope_rotate(a.dk.data(), n, c.n_kv_heads, c.head_dim, acts.positions.data(), rope, true);
      std::vector<T> dxn(dx.size(), T(0));
      back(&a, l, model::LoraTarget::Q, a.xn.data(), n, dq.data(), dxn.data());
      back(&a, l, model::LoraTarget::K, a.xn.data(), n, a.dk.data(), dxn.data());
      back(&a, l, model::LoraTarget::V, a.xn.data(), n, a.dv.data(), dxn.data());
      rmsnorm_backward(a.x_in.data(), L.attn_norm.data(), n, c.dim, c.rms_eps, dxn.data(), dx.data(),
                       static_cast<T*>(nullptr));
      if (recompute_) a.drop_intermediates();
    }
  }
}

template struct LoraParams<float>;
template struct LoraParams<double>;
template class Graph<float>;
template class Graph<double>;

}  // namespace choreo::train
