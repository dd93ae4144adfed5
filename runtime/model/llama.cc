#include "runtime/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <xxhash.h>

#include "kernels/quant.h"
#include "common/error.h"

namespace choreo::model {

using kernels::DType;

void Batch::clear() {
  tokens.clear();
  positions.clear();
  kv_page.clear();
  kv_slot.clear();
  groups.clear();
  logit_rows.clear();
  top_k = 0;
  top_ids = nullptr;
  first_layer = 0;
  end_layer = -1;
  x_in = nullptr;
  capture_layers.clear();
  capture = nullptr;
}

void RunState::reserve(kernels::Backend& be, const LlamaConfig& c, int n_rows) {
  if (backend != &be) capacity = 0;  // a model on another backend: its own memory
  backend = &be;
  if (n_rows <= capacity) return;
  size_t n = size_t(n_rows);
  int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  x.reserve(be, n * c.dim);
  xb.reserve(be, n * std::max(c.dim, q_dim));
  xb2.reserve(be, n * c.dim);
  q.reserve(be, n * q_dim);
  k.reserve(be, n * kv_dim);
  v.reserve(be, n * kv_dim);
  att.reserve(be, n * q_dim);
  hb.reserve(be, n * c.ffn_dim);
  hb2.reserve(be, n * c.ffn_dim);
  logits_in.reserve(be, n * c.dim);
  capacity = n_rows;
}

Model::Model(gguf::File file, kernels::Backend& backend) : file_(std::move(file)), backend_(backend) {}

std::unique_ptr<Model> Model::load(const std::string& path, kernels::Backend& backend) {
  std::unique_ptr<Model> m(new Model(gguf::File::open(path), backend));
  m->load_config();
  m->load_weights();
  m->vocab_ = std::make_unique<Vocab>(Vocab::from_gguf(m->file_));
  m->chat_format_ = detect_chat_format(m->file_);
  return m;
}

void Model::load_config() {
  const gguf::File& f = file_;
  LlamaConfig& c = config_;
  c.architecture = f.get_string("general.architecture", "");
  if (c.architecture != "llama") {
    throw InputError(fmt::format("{}: unsupported architecture '{}'", f.path(), c.architecture),
                     "choreo runs llama-family GGUF models (general.architecture = llama: Llama 2/3, "
                     "SmolLM2, TinyLlama, Mistral)");
  }
  const std::string a = c.architecture + ".";
  c.dim = int(f.require_int(a + "embedding_length"));
  c.n_layers = int(f.require_int(a + "block_count"));
  c.ffn_dim = int(f.require_int(a + "feed_forward_length"));
  c.n_heads = int(f.require_int(a + "attention.head_count"));
  c.n_kv_heads = int(f.get_int(a + "attention.head_count_kv", c.n_heads));
  const int64_t n_ctx = f.get_int(a + "context_length", 2048);
  if (n_ctx < 1 || n_ctx > LlamaConfig::kMaxContextLength)
    throw InputError(fmt::format("{}: metadata key '{}context_length' = {} is out of range (1 to {} tokens)",
                                 f.path(), a, n_ctx, LlamaConfig::kMaxContextLength),
                     "the file's metadata is damaged; take the model's context length from its model card");
  c.n_ctx_train = int(n_ctx);
  c.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_freq_base = float(f.get_float(a + "rope.freq_base", 10000.0));
  auto bad = [&](const std::string& what) {
    return InputError(fmt::format("{}: inconsistent hyper-parameters: {}", f.path(), what));
  };
  if (c.dim <= 0 || c.n_layers <= 0 || c.ffn_dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0)
    throw bad("dimensions must be positive");
  if (c.dim > (1 << 16) || c.n_layers > 1024 || c.ffn_dim > (1 << 18) || c.n_heads > 1024)
    throw bad("dimensions are implausibly large");
  c.head_dim = int(f.get_int(a + "attention.key_length", c.dim / c.n_heads));
  if (c.head_dim <= 0 || c.head_dim > 256 || c.head_dim % 2 != 0)
    throw bad(fmt::format("head size {} (must be even and at most 256)", c.head_dim));
  if (c.n_heads % c.n_kv_heads != 0)
    throw bad(fmt::format("{} heads is not a multiple of {} KV heads", c.n_heads, c.n_kv_heads));
  c.rope_dims = int(f.get_int(a + "rope.dimension_count", c.head_dim));
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    throw bad(fmt::format("rope dimension count {}", c.rope_dims));
  std::string scaling = f.get_string(a + "rope.scaling.type", "none");
  if (scaling != "none" && scaling != "" ) {
    throw InputError(fmt::format("{}: rope scaling type '{}' is not supported", f.path(), scaling),
                     "supported: none, and Llama-3 frequency factors (rope_freqs.weight)");
  }
}

kernels::Weight weight_view(const gguf::File& f, const std::string& name, int64_t n_in, int64_t n_out) {
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) throw InputError(fmt::format("{}: missing tensor '{}'", f.path(), name));
  if (t->shape.size() != 2 || t->shape[0] != n_in || t->shape[1] != n_out) {
    std::string got;
    for (size_t i = 0; i < t->shape.size(); ++i) got += (i ? ", " : "") + std::to_string(t->shape[i]);
    throw InputError(fmt::format("{}: tensor '{}' has shape [{}], expected [{}, {}]", f.path(), name, got, n_in,
                                 n_out));
  }
  if (!kernels::is_supported(t->type)) {
    throw InputError(fmt::format("{}: tensor '{}' has type {}, which choreo cannot compute with", f.path(), name,
                                 kernels::type_traits(t->type).name),
                     "supported types: F32, F16, BF16, Q8_0, Q4_0, Q4_1 (requantize with llama-quantize)");
  }
  kernels::Weight w;
  w.type = t->type;
  w.data = t->data;
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_stride = kernels::row_bytes(t->type, n_in);
  return w;
}

static std::vector<float> vector_f32(const gguf::File& f, const std::string& name, int64_t n) {
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) throw InputError(fmt::format("{}: missing tensor '{}'", f.path(), name));
  if (t->n_elements() != n || t->shape[0] != n) {
    throw InputError(fmt::format("{}: tensor '{}' has {} elements, expected {}", f.path(), name,
                                 t->n_elements(), n));
  }
  if (!kernels::is_supported(t->type))
    throw InputError(fmt::format("{}: tensor '{}' has unsupported type {}", f.path(), name,
                                 kernels::type_traits(t->type).name));
  std::vector<float> out(n);
  kernels::dequantize_row(t->type, t->data, out.data(), n);
  return out;
}

void Model::load_weights() {
  const gguf::File& f = file_;
  LlamaConfig& c = config_;
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  if (!emb || emb->shape.size() != 2)
    throw InputError(fmt::format("{}: missing or malformed tensor 'token_embd.weight'", f.path()));
  c.n_vocab = int(emb->shape[1]);
  token_embd_ = weight_view(f, "token_embd.weight", c.dim, c.n_vocab);
  output_norm_ = vector_f32(f, "output_norm.weight", c.dim);
  output_norm_on_backend_ = kernels::Buffer<float>(backend_, output_norm_);
  c.tied_output = f.tensor("output.weight") == nullptr;
  // The embedding table is read by rows (embed); the output projection, tied to it or not, by matmul. A tied
  // table is uploaded once, for both.
  output_ = backend_.upload_weight(c.tied_output ? token_embd_ : weight_view(f, "output.weight", c.dim, c.n_vocab));
  embed_table_ = c.tied_output ? output_ : backend_.upload_table(token_embd_);
  if (f.tensor("rope_freqs.weight")) c.rope_freq_factors = vector_f32(f, "rope_freqs.weight", c.rope_dims / 2);

  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LayerWeights& L = layers_[l];
    L.attn_norm = vector_f32(f, p + "attn_norm.weight", c.dim);
    L.ffn_norm = vector_f32(f, p + "ffn_norm.weight", c.dim);
    L.attn_norm_on_backend = kernels::Buffer<float>(backend_, L.attn_norm);
    L.ffn_norm_on_backend = kernels::Buffer<float>(backend_, L.ffn_norm);
    L.wq = backend_.upload_weight(weight_view(f, p + "attn_q.weight", c.dim, q_dim));
    L.wk = backend_.upload_weight(weight_view(f, p + "attn_k.weight", c.dim, kv_dim));
    L.wv = backend_.upload_weight(weight_view(f, p + "attn_v.weight", c.dim, kv_dim));
    L.wo = backend_.upload_weight(weight_view(f, p + "attn_output.weight", q_dim, c.dim));
    L.w_gate = backend_.upload_weight(weight_view(f, p + "ffn_gate.weight", c.dim, c.ffn_dim));
    L.w_up = backend_.upload_weight(weight_view(f, p + "ffn_up.weight", c.dim, c.ffn_dim));
    L.w_down = backend_.upload_weight(weight_view(f, p + "ffn_down.weight", c.ffn_dim, c.dim));
  }
}

void Model::check_tokens(std::span<const Token> tokens, std::string_view what) const {
  for (Token t : tokens)
    if (t < 0 || t >= config_.n_vocab)
      throw InputError(fmt::format("{}{}token id {} is outside the vocabulary (0..{})", what, what.empty() ? "" : ": ",
                                   t, config_.n_vocab - 1));
}

uint64_t Model::fingerprint() const {
  std::call_once(fingerprint_once_, [this] {
    std::span<const uint8_t> bytes = file_.bytes();
    fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
  });
  return fingerprint_;
}

kernels::RopeParams Model::rope_params() const {
  kernels::RopeParams p;
  p.layout = config_.rope_layout;
  p.n_dims = config_.rope_dims;
  p.freq_base = config_.rope_freq_base;
  p.freq_factors = config_.rope_freq_factors.empty() ? nullptr : config_.rope_freq_factors.data();
  return p;
}

kernels::KvLayout Model::kv_layout(int page_tokens, kernels::DType k_type, kernels::DType v_type) const {
  if (page_tokens < 1 || page_tokens > kernels::kMaxPageTokens)
    throw InputError(fmt::format("{} tokens per KV page; a page holds 1 to {} tokens", page_tokens,
                                 kernels::kMaxPageTokens),
                     "the default is 32");
  kernels::KvLayout kv;
  kv.page_tokens = page_tokens;
  kv.n_layers = config_.n_layers;
  kv.n_kv_heads = config_.n_kv_heads;
  kv.head_dim = config_.head_dim;
  kv.k_type = k_type;
  kv.v_type = v_type;
  kv.check();
  return kv;
}

void Model::forward(const Batch& batch, RunState& s, float* logits) const {
  const LlamaConfig& c = config_;
  kernels::Backend& be = backend_;
  const int n = batch.size();
  if (n == 0) return;
  s.reserve(be, c, n);
  const kernels::RopeParams rope = rope_params();
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  const kernels::KvLayout& kv = batch.kv;

  std::vector<kernels::AttentionGroup> groups(batch.groups.size());
  bool lora = false;  // any group on adapters
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g] = {batch.groups[g].q_begin, batch.groups[g].q_end, batch.groups[g].segments};
    lora = lora || (batch.groups[g].lora && !batch.groups[g].lora->empty());
  }

  const int first = batch.first_layer;
  const int end = batch.end_layer < 0 ? c.n_layers : batch.end_layer;
  if (first < 0 || first > end || end > c.n_layers)
    throw InputError(fmt::format("layers [{}, {}) are outside the model's {} layers", first, end, c.n_layers));
  const size_t row_floats = size_t(n) * c.dim;
  if (batch.x_in)
    be.upload(s.x.data(), batch.x_in, sizeof(float) * row_floats);
  else
    be.embed(embed_table_, batch.tokens, s.x.data());
  const auto capture = [&](int l) {
    for (size_t i = 0; i < batch.capture_layers.size(); ++i)
      if (batch.capture_layers[i] == l) be.download(batch.capture + i * row_floats, s.x.data(), sizeof(float) * row_floats);
  };
  for (int l = first; l < end; ++l) {
    capture(l);
    const LayerWeights& L = layers_[l];
    // Attention block.
    be.rmsnorm(s.x.data(), L.attn_norm_on_backend.data(), n, c.dim, c.rms_eps, s.xb.data());
    const kernels::MatmulOutput qkv[] = {{&L.wq, s.q.data()}, {&L.wk, s.k.data()}, {&L.wv, s.v.data()}};
    be.matmul_group(qkv, s.xb.data(), n);
    if (lora) {
      apply_lora(batch, l, LoraTarget::Q, s.xb.data(), s.q.data(), s);
      apply_lora(batch, l, LoraTarget::K, s.xb.data(), s.k.data(), s);
      apply_lora(batch, l, LoraTarget::V, s.xb.data(), s.v.data(), s);
    }
    be.rope(s.q.data(), n, c.n_heads, c.head_dim, batch.positions.data(), rope);
    be.rope(s.k.data(), n, c.n_kv_heads, c.head_dim, batch.positions.data(), rope);
    be.store_kv(kv, l, batch.kv_page, batch.kv_slot, s.k.data(), s.v.data());
    be.attention(l, s.q.data(), n, c.n_heads, kv, groups, rope, scale, s.att.data());
    be.matmul(L.wo, s.att.data(), n, s.xb2.data());
    if (lora) apply_lora(batch, l, LoraTarget::O, s.att.data(), s.xb2.data(), s);
    be.add(s.x.data(), s.xb2.data(), size_t(n) * c.dim);
    // Feed-forward block.
    be.rmsnorm(s.x.data(), L.ffn_norm_on_backend.data(), n, c.dim, c.rms_eps, s.xb.data());
    const kernels::MatmulOutput gate_up[] = {{&L.w_gate, s.hb.data()}, {&L.w_up, s.hb2.data()}};
    be.matmul_group(gate_up, s.xb.data(), n);
    if (lora) {
      apply_lora(batch, l, LoraTarget::Gate, s.xb.data(), s.hb.data(), s);
      apply_lora(batch, l, LoraTarget::Up, s.xb.data(), s.hb2.data(), s);
    }
    be.swiglu(s.hb.data(), s.hb2.data(), size_t(n) * c.ffn_dim, s.hb.data());
    be.matmul(L.w_down, s.hb.data(), n, s.xb2.data());
    if (lora) apply_lora(batch, l, LoraTarget::Down, s.hb.data(), s.xb2.data(), s);
    be.add(s.x.data(), s.xb2.data(), size_t(n) * c.dim);
  }
  capture(end);
  const int n_out = int(batch.logit_rows.size());
  if (n_out == 0 || end < c.n_layers) return;
  for (int i = 0; i < n_out; ++i)
    be.copy(s.logits_in.data() + size_t(i) * c.dim, s.x.data() + size_t(batch.logit_rows[i]) * c.dim,
            sizeof(float) * c.dim);
  be.rmsnorm(s.logits_in.data(), output_norm_on_backend_.data(), n_out, c.dim, c.rms_eps, s.xb.data());
  const size_t logit_floats = size_t(n_out) * size_t(c.n_vocab);
  s.logits.reserve(be, logit_floats);
  be.matmul(output_, s.xb.data(), n_out, s.logits.data());
  if (lora) apply_lora(batch, -1, LoraTarget::Output, s.xb.data(), s.logits.data(), s);
  if (batch.top_k > 0) {
    const size_t candidates = size_t(n_out) * size_t(batch.top_k);
    s.top_values.reserve(be, candidates);
    s.top_ids.reserve(be, candidates);
    be.top_k(s.logits.data(), n_out, c.n_vocab, batch.top_k, s.top_ids.data(), s.top_values.data());
    be.download(logits, s.top_values.data(), sizeof(float) * candidates);
    be.download(batch.top_ids, s.top_ids.data(), sizeof(int32_t) * candidates);
    return;
  }
  be.download(logits, s.logits.data(), sizeof(float) * logit_floats);
}

void Model::apply_lora(const Batch& batch, int layer, LoraTarget t, const float* x, float* y, RunState& s) const {
  kernels::Backend& be = backend_;
  // Rows [r0, r1) of x and y run with `stack`: each adapter that adapts t adds its scaled product, in the
  // stack's order, as llama.cpp does (Backend::add_lora: the product B·(A·x), then scaled, then added).
  const auto run = [&](const LoraStack* stack, int r0, int r1) {
    if (!stack || r1 <= r0) return;
    const size_t rows = size_t(r1 - r0);
    for (const auto& [adapter, user_scale] : stack->adapters) {
      const LoraPair* p = adapter->find(layer, t);
      if (!p) continue;
      s.lora_scratch.reserve(be, rows * size_t(p->rank() + p->b.n_out));
      be.add_lora(p->a, p->b, p->scale(user_scale), x + size_t(r0) * size_t(p->a.n_in), int(rows),
                  y + size_t(r0) * size_t(p->b.n_out), s.lora_scratch.data());
    }
  };
  if (t != LoraTarget::Output) {
    // Consecutive groups with the same stack are one run of rows.
    size_t g = 0;
    while (g < batch.groups.size()) {
      size_t e = g + 1;
      while (e < batch.groups.size() && batch.groups[e].lora == batch.groups[g].lora &&
             batch.groups[e].q_begin == batch.groups[e - 1].q_end)
        ++e;
      run(batch.groups[g].lora, batch.groups[g].q_begin, batch.groups[e - 1].q_end);
      g = e;
    }
    return;
  }
  // The output projection's rows are the logit rows, in order: each takes the stack of its row's group.
  const auto stack_of = [&](int row) -> const LoraStack* {
    for (const Batch::Group& grp : batch.groups)
      if (row >= grp.q_begin && row < grp.q_end) return grp.lora;
    return nullptr;
  };
  const int n_out = int(batch.logit_rows.size());
  for (int i = 0; i < n_out;) {
    const LoraStack* stack = stack_of(batch.logit_rows[size_t(i)]);
    int e = i + 1;
    while (e < n_out && stack_of(batch.logit_rows[size_t(e)]) == stack) ++e;
    run(stack, i, e);
    i = e;
  }
}

}  // namespace choreo::model
