#pragma once
// The compute seam between model code and devices (DESIGN.md §8). Model code calls only this interface;
// kernels/cpu implements it always, kernels/cuda when built with CUDA. Pointers passed to a backend refer
// to memory that backend owns or accepts (host memory for the CPU backend, device memory for CUDA).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kernels/dtype.h"

namespace choreo::kernels {

/// A weight matrix as stored in GGUF: n_out rows of n_in elements (ggml shape [n_in, n_out]).
struct Weight {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t n_out = 0;
  int64_t n_in = 0;
  size_t row_stride = 0;  // bytes between rows
};

/// How rotary embeddings are applied. Angles are linear in the position, so a rotation by a then by b equals
/// one by a+b; virtual repositioning relies on that.
struct RopeParams {
  enum class Layout { Interleaved, Halves };  // adjacent pairs (llama GGUF) / first-half with second-half (NeoX)
  Layout layout = Layout::Interleaved;
  int n_dims = 0;               // rotated dims per head (== head_dim for llama)
  float freq_base = 10000.0f;
  const float* freq_factors = nullptr;  // Llama-3 rope scaling: n_dims/2 divisors of the frequencies, or null
};

/// Layout of one KV page (page_tokens tokens, every layer). K is stored head-dimension-major per layer and KV
/// head, [n_layers][n_kv_heads][head_dim][page_tokens], so attention reads a head's keys as a ready
/// [head_dim x page_tokens] tile; V is token-major, [n_layers][page_tokens][n_kv_heads * head_dim].
/// The most tokens a KV page may hold (the --page-tokens bound).
constexpr int kMaxPageTokens = 4096;

struct KvLayout {
  int page_tokens = 32;
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int kv_dim() const { return n_kv_heads * head_dim; }
  /// Pages that hold `n_tokens` tokens.
  size_t pages_for(size_t n_tokens) const { return (n_tokens + page_tokens - 1) / page_tokens; }
  size_t page_floats() const { return size_t(2) * n_layers * page_tokens * kv_dim(); }
  /// Start of the [head_dim][page_tokens] key tile of one layer and KV head.
  size_t k_tile(int layer, int kv_head) const { return (size_t(layer) * n_kv_heads + kv_head) * head_dim * page_tokens; }
  /// Start of the value row (kv_dim floats) of one layer and slot.
  size_t v_offset(int layer, int slot) const {
    return size_t(n_layers) * page_tokens * kv_dim() + (size_t(layer) * page_tokens + slot) * kv_dim();
  }
  /// Stores / loads one token's key row (kv_dim floats, heads consecutive) at a slot.
  void write_k(float* page, int layer, int slot, const float* k_row) const {
    for (int h = 0; h < n_kv_heads; ++h) {
      float* tile = page + k_tile(layer, h) + slot;
      for (int d = 0; d < head_dim; ++d) tile[size_t(d) * page_tokens] = k_row[h * head_dim + d];
    }
  }
  void read_k(const float* page, int layer, int slot, float* k_row) const {
    for (int h = 0; h < n_kv_heads; ++h) {
      const float* tile = page + k_tile(layer, h) + slot;
      for (int d = 0; d < head_dim; ++d) k_row[h * head_dim + d] = tile[size_t(d) * page_tokens];
    }
  }
};

/// A run of cached tokens visible to some queries: the tokens live in `pages` (in order), their keys were
/// rotated at their encoded positions, and they are logically placed `delta` positions later.
/// With causal_base >= 0, query j of its group sees only tokens [0, causal_base + j] (a message's own tokens).
struct KvSegment {
  std::span<float* const> pages;
  int n_tokens = 0;
  int delta = 0;
  int causal_base = -1;
};

/// Query rows [q_begin, q_end) that share one view of the cache.
struct AttentionGroup {
  int q_begin = 0;
  int q_end = 0;
  std::span<const KvSegment> segments;
};

/// The operations a forward pass needs. All activations are fp32, row-major.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual void set_threads(int n_threads) = 0;
  virtual int threads() const = 0;

  /// y[i, :] = W · x[i, :] for i < n.   x: [n, n_in], y: [n, n_out].
  virtual void matmul(const Weight& w, const float* x, int n, float* y) = 0;
  /// out[i, :] = row ids[i] of the table, dequantised.
  virtual void embed(const Weight& table, std::span<const int32_t> ids, float* out) = 0;
  /// out[i, :] = x[i, :] / rms(x[i, :]) * weight.
  virtual void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) = 0;
  /// Rotates each head of x[i] (n_heads heads of head_dim) by position pos[i].
  virtual void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const RopeParams& p) = 0;
  /// out = silu(gate) * up, elementwise over n values.
  virtual void swiglu(const float* gate, const float* up, size_t n, float* out) = 0;
  /// x += y over n values.
  virtual void add(float* x, const float* y, size_t n) = 0;
  /// Softmax attention of q ([n_q, n_heads*head_dim], rotated at each query's own position) over the
  /// segments of each group, for one layer; writes out [n_q, n_heads*head_dim]. A segment with delta != 0 is
  /// attended by rotating the query by -delta (virtual repositioning), never by touching stored keys.
  virtual void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
                         std::span<const AttentionGroup> groups, const RopeParams& rope, float scale,
                         float* out) = 0;
};

/// The most threads a backend accepts (llama.cpp's limit too); far more than this exhausts the process.
constexpr int kMaxThreads = 512;

/// The CPU backend (always available); picks SIMD kernels for this processor at run time. n_threads <= 0
/// means one per core; more than kMaxThreads is an InputError.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace choreo::kernels
