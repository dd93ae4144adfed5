#pragma once
// A float64 re-implementation of the engine's semantics for small F32 llama models, written from the
// definitions (DESIGN.md §2) and independent of the engine's code: a message is encoded token by token
// attending to its context entries (other encodings, with their keys re-rotated by a position shift) and to
// its own earlier tokens. Used as the brute-force reference for choreographed calls.

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "runtime/model/gguf.h"
#include "runtime/model/llama.h"

namespace choreo::testing {

class ReferenceModel {
 public:
  /// Per-layer keys and values of an encoded message: [layer][token][kv_dim].
  struct Encoding {
    std::vector<std::vector<std::vector<double>>> k, v;
    int start = 0;
  };
  /// A context entry: the first n_tokens of an encoding, logically shifted by delta positions.
  struct View {
    const Encoding* enc;
    int delta;
    int n_tokens;
  };

  explicit ReferenceModel(const model::Model& m) : c_(m.config()) {
    const gguf::File& f = m.file();
    auto mat = [&](const std::string& name) {
      const gguf::TensorInfo* t = f.tensor(name);
      std::vector<float> tmp(t->n_elements());
      kernels::dequantize_row(t->type, t->data, tmp.data(), t->n_elements());
      return std::vector<double>(tmp.begin(), tmp.end());
    };
    embd_ = mat("token_embd.weight");
    out_ = f.tensor("output.weight") ? mat("output.weight") : embd_;
    out_norm_ = mat("output_norm.weight");
    for (int l = 0; l < c_.n_layers; ++l) {
      std::string p = "blk." + std::to_string(l) + ".";
      layers_.push_back({mat(p + "attn_norm.weight"), mat(p + "ffn_norm.weight"), mat(p + "attn_q.weight"),
                         mat(p + "attn_k.weight"), mat(p + "attn_v.weight"), mat(p + "attn_output.weight"),
                         mat(p + "ffn_gate.weight"), mat(p + "ffn_up.weight"), mat(p + "ffn_down.weight")});
    }
  }

  /// Encodes tokens at positions start.., attending to `context` and to earlier own tokens. Returns the
  /// encoding; `last_logits` (if given) receives the logits of the last token.
  Encoding encode(std::span<const int32_t> tokens, int start, const std::vector<View>& context,
                  std::vector<double>* last_logits = nullptr) const {
    const int kv_dim = c_.n_kv_heads * c_.head_dim, q_dim = c_.n_heads * c_.head_dim;
    Encoding e;
    e.start = start;
    e.k.assign(c_.n_layers, {});
    e.v.assign(c_.n_layers, {});
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int pos = start + int(i);
      std::vector<double> x(embd_.begin() + size_t(tokens[i]) * c_.dim, embd_.begin() + size_t(tokens[i] + 1) * c_.dim);
      for (int l = 0; l < c_.n_layers; ++l) {
        const Layer& L = layers_[l];
        std::vector<double> xb = rmsnorm(x, L.attn_norm);
        std::vector<double> q = matvec(L.wq, xb, q_dim), k = matvec(L.wk, xb, kv_dim), v = matvec(L.wv, xb, kv_dim);
        for (int h = 0; h < c_.n_heads; ++h) rotate(&q[size_t(h) * c_.head_dim], pos);
        for (int h = 0; h < c_.n_kv_heads; ++h) rotate(&k[size_t(h) * c_.head_dim], pos);
        e.k[l].push_back(k);
        e.v[l].push_back(v);
        // Every visible key, re-rotated to its logical position, with its value.
        std::vector<const std::vector<double>*> vals;
        std::vector<std::vector<double>> keys;
        for (const View& view : context)
          for (int t = 0; t < view.n_tokens; ++t) {
            std::vector<double> kk = view.enc->k[l][t];
            for (int h = 0; h < c_.n_kv_heads; ++h) rotate(&kk[size_t(h) * c_.head_dim], view.delta);
            keys.push_back(std::move(kk));
            vals.push_back(&view.enc->v[l][t]);
          }
        for (size_t t = 0; t <= i; ++t) {
          keys.push_back(e.k[l][t]);
          vals.push_back(&e.v[l][t]);
        }
        std::vector<double> att(q_dim, 0.0);
        const int group = c_.n_heads / c_.n_kv_heads;
        for (int h = 0; h < c_.n_heads; ++h) {
          const int kvh = h / group;
          std::vector<double> s(keys.size());
          double mx = -1e300;
          for (size_t t = 0; t < keys.size(); ++t) {
            double d = 0;
            for (int j = 0; j < c_.head_dim; ++j) d += q[size_t(h) * c_.head_dim + j] * keys[t][size_t(kvh) * c_.head_dim + j];
            s[t] = d / std::sqrt(double(c_.head_dim));
            mx = std::max(mx, s[t]);
          }
          double z = 0;
          for (double& w : s) z += (w = std::exp(w - mx));
          for (size_t t = 0; t < keys.size(); ++t)
            for (int j = 0; j < c_.head_dim; ++j)
              att[size_t(h) * c_.head_dim + j] += s[t] / z * (*vals[t])[size_t(kvh) * c_.head_dim + j];
        }
        std::vector<double> o = matvec(L.wo, att, c_.dim);
        for (int j = 0; j < c_.dim; ++j) x[j] += o[j];
        xb = rmsnorm(x, L.ffn_norm);
        std::vector<double> g = matvec(L.w_gate, xb, c_.ffn_dim), u = matvec(L.w_up, xb, c_.ffn_dim);
        for (int j = 0; j < c_.ffn_dim; ++j) g[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
        std::vector<double> d = matvec(L.w_down, g, c_.dim);
        for (int j = 0; j < c_.dim; ++j) x[j] += d[j];
      }
      if (last_logits && i + 1 == tokens.size()) *last_logits = matvec(out_, rmsnorm(x, out_norm_), c_.n_vocab);
    }
    return e;
  }

 private:
  struct Layer {
    std::vector<double> attn_norm, ffn_norm, wq, wk, wv, wo, w_gate, w_up, w_down;
  };

  std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w) const {
    double ss = 0;
    for (double a : x) ss += a * a;
    double inv = 1.0 / std::sqrt(ss / x.size() + c_.rms_eps);
    std::vector<double> y(x.size());
    for (size_t j = 0; j < x.size(); ++j) y[j] = x[j] * inv * w[j];
    return y;
  }
  static std::vector<double> matvec(const std::vector<double>& w, const std::vector<double>& x, int n_out) {
    std::vector<double> y(n_out, 0.0);
    const size_t n_in = x.size();
    for (int o = 0; o < n_out; ++o)
      for (size_t j = 0; j < n_in; ++j) y[o] += w[o * n_in + j] * x[j];
    return y;
  }
  /// Rotary embedding of one head by `pos`, adjacent-pair layout (llama GGUF), with Llama-3 factors if any.
  void rotate(double* h, double pos) const {
    for (int i = 0; i < c_.rope_dims / 2; ++i) {
      double inv = std::pow(double(c_.rope_freq_base), -2.0 * i / c_.rope_dims);
      if (!c_.rope_freq_factors.empty()) inv /= c_.rope_freq_factors[i];
      double a = pos * inv, cs = std::cos(a), sn = std::sin(a);
      double x0 = h[2 * i], x1 = h[2 * i + 1];
      h[2 * i] = x0 * cs - x1 * sn;
      h[2 * i + 1] = x0 * sn + x1 * cs;
    }
  }

  model::LlamaConfig c_;
  std::vector<double> embd_, out_, out_norm_;
  std::vector<Layer> layers_;
};

}  // namespace choreo::testing
