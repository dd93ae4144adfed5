#pragma once
// A Llama-family transformer loaded from GGUF and its forward pass over a batch of tokens whose keys and
// values are written into KV pages and whose attention reads lists of KV segments (DESIGN.md §2, §5).

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/gguf.h"
#include "runtime/model/lora.h"
#include "runtime/model/vocab.h"

namespace choreo::model {

/// Hyper-parameters read from GGUF metadata.
struct LlamaConfig {
  std::string architecture;
  int n_vocab = 0;
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ffn_dim = 0;
  int n_ctx_train = 0;  ///< `llama.context_length`, 1..kMaxContextLength
  /// The largest context_length accepted (2^28 tokens, far past any real model): positions, and sums of a
  /// position, a prompt and a token budget, stay far from int overflow.
  static constexpr int64_t kMaxContextLength = int64_t(1) << 28;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  int rope_dims = 0;
  kernels::RopeParams::Layout rope_layout = kernels::RopeParams::Layout::Interleaved;
  bool tied_output = false;
  std::vector<float> rope_freq_factors;  // Llama-3 scaling; empty when absent
};

/// Views of one layer's weights (pointing into the mapped file), and its norms (in host memory for
/// fine-tuning, and uploaded to the backend's memory for the forward pass).
struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  kernels::Buffer<float> attn_norm_on_backend, ffn_norm_on_backend;
  kernels::Weight wq, wk, wv, wo, w_gate, w_up, w_down;
};

/// One batch for Model::forward. Rows are tokens; `groups` partition the rows into calls that share a view
/// of the cache (DESIGN.md §2); `segments[g]` lists the view of group g, the last segment usually being the
/// call's own pages (causal).
struct Batch {
  kernels::KvLayout kv;             // layout of the pages below
  std::vector<Token> tokens;
  std::vector<int32_t> positions;
  std::vector<kernels::PageId> kv_page;  // per row: the page that receives its K/V
  std::vector<int32_t> kv_slot;   // per row: the slot in that page
  struct Group {
    int q_begin = 0, q_end = 0;
    std::vector<kernels::KvSegment> segments;
    /// The adapters this call runs with (lora.h), or null for the base model. Groups with different stacks
    /// share one forward pass; rows on the base model skip the adapter work.
    const LoraStack* lora = nullptr;
  };
  std::vector<Group> groups;
  std::vector<int32_t> logit_rows;  // rows whose logits are wanted, in output order
  /// > 0: only each logit row's top_k largest logits are wanted, in model::Sampler's order (value descending,
  /// ties by the lower id), found where the logits were computed (kernels::Backend::top_k), so that only
  /// candidates travel to the host: forward writes their values to `logits` (top_k floats per logit row) and
  /// their token ids to `top_ids`. 0: every logit.
  int top_k = 0;
  int32_t* top_ids = nullptr;
  /// The layers this pass runs: [first_layer, end_layer) (end_layer -1: to the last). Only those layers' K/V
  /// are written. With `x_in`, rows start from it (dim floats per row: each row's hidden state at the input of
  /// first_layer, the E cache of DESIGN.md §6) instead of the token embeddings. Logits are computed only by
  /// a pass that runs the last layer.
  int first_layer = 0;
  int end_layer = -1;
  const float* x_in = nullptr;
  /// Each row's hidden state at the input of each of these layers (ascending) is copied to `capture`: layer
  /// capture_layers[i] to capture + i * size() * dim (dim floats per row). A layer of n_layers captures the
  /// output of the last layer (before the final norm).
  std::vector<int> capture_layers;
  float* capture = nullptr;

  int size() const { return int(tokens.size()); }
  void clear();
};

/// Scratch memory of the forward pass in the backend's memory (kernels::Backend::alloc), allocated for the
/// largest batch seen (never per token).
struct RunState {
  kernels::Backend* backend = nullptr;  // whose memory the buffers are
  int capacity = 0;
  kernels::Buffer<float> x, xb, xb2, q, k, v, att, hb, hb2, logits_in, logits;
  kernels::Buffer<float> top_values;  // Batch::top_k's candidates
  kernels::Buffer<int32_t> top_ids;
  kernels::Buffer<float> lora_scratch;  // LoRA (Backend::add_lora): rows x (rank + the adapted n_out), grown on use
  void reserve(kernels::Backend& backend, const LlamaConfig& c, int n_rows);
};

/// The matrix tensor `name` of `f` as a Weight of n_out rows of n_in (ggml shape [n_in, n_out]), read in place.
/// InputError naming the file and the tensor when it is missing, has another shape or a type choreo does not
/// compute with. (The GGUF reader already rejects rows that are not whole blocks.)
kernels::Weight weight_view(const gguf::File& f, const std::string& name, int64_t n_in, int64_t n_out);

/// A loaded model: weights, vocabulary, chat format and the forward pass.
class Model {
 public:
  /// Opens `path` and validates every tensor the architecture needs. Throws InputError on a bad file.
  static std::unique_ptr<Model> load(const std::string& path, kernels::Backend& backend);

  const LlamaConfig& config() const { return config_; }
  const Vocab& vocab() const { return *vocab_; }
  const gguf::File& file() const { return file_; }
  ChatFormat chat_format() const { return chat_format_; }
  kernels::Backend& backend() const { return backend_; }
  kernels::RopeParams rope_params() const;
  /// The layout of KV pages of `page_tokens` tokens for this model, in the given cache types (checked:
  /// InputError when a type cannot hold this model's heads).
  kernels::KvLayout kv_layout(int page_tokens, kernels::DType k_type = kernels::DType::F32,
                              kernels::DType v_type = kernels::DType::F32) const;
  /// Identity of the weights for content keys: XXH3 of the whole file (computed once, on first use).
  uint64_t fingerprint() const;

  /// Throws InputError if any id is outside [0, n_vocab); `what` (may be empty) names the caller's input.
  void check_tokens(std::span<const Token> tokens, std::string_view what = {}) const;

  /// Runs all layers on the batch: writes each row's K/V into its page slot and fills
  /// logits[i * n_vocab ...] for batch.logit_rows[i].
  void forward(const Batch& batch, RunState& state, float* logits) const;

  /// The weights, as loaded (for fine-tuning, which dequantises them: runtime/train).
  const kernels::Weight& token_embedding() const { return token_embd_; }
  const kernels::Weight& output_weight() const { return output_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }

 private:
  Model(gguf::File file, kernels::Backend& backend);
  void load_config();
  void load_weights();
  /// y[r] += s * B·(A·x[r]) for every row r of a group whose stack adapts `t` of `layer` (layer -1 and
  /// Output: the rows are batch.logit_rows, in order).
  void apply_lora(const Batch& batch, int layer, LoraTarget t, const float* x, float* y, RunState& s) const;

  gguf::File file_;
  kernels::Backend& backend_;
  LlamaConfig config_;
  std::unique_ptr<Vocab> vocab_;
  ChatFormat chat_format_ = ChatFormat::None;
  kernels::Weight token_embd_, output_;
  kernels::Weight embed_table_;  // token_embd_ as the backend's embed reads it (upload_table, or output_ when tied)
  std::vector<float> output_norm_;
  kernels::Buffer<float> output_norm_on_backend_;
  std::vector<LayerWeights> layers_;
  mutable std::once_flag fingerprint_once_;
  mutable uint64_t fingerprint_ = 0;
};

}  // namespace choreo::model
