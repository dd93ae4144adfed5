#pragma once
// The operations of the Llama forward pass with their backward passes, side by side (issue 13, DESIGN.md
// §9): what `choreo finetune train` differentiates through. Every op is written once for a scalar type T and
// instantiated for float (training) and double (the finite-difference reference of the tests). Frozen base
// weights come in as float; activations and gradients are T. Matrices are row-major; every backward ADDS
// its gradients into the output buffers (a value read by several later ops sums their contributions), so
// callers zero them first.
//
// The attention op is choreo's segment attention (DESIGN.md §2): a call's query rows attend to a list of
// segments, each a run of cached keys and values rotated at their own encoded positions and placed `delta`
// positions later, which the query sees by being rotated by (its position - delta) instead (virtual
// repositioning); a segment with causal_base >= 0 is the call's own tokens (query j sees keys up to
// causal_base + j). Its backward gives gradients for the queries and for every segment's keys and values, so
// the loss of a later call reaches the encodings of the parents it read.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.h"

namespace choreo::train {

// ---- RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, per row of dim --------------------------------------

template <class T>
void rmsnorm_forward(const T* x, const float* w, int rows, int dim, float eps, T* y);
/// dx += dL/dx; dw (when not null) += dL/dw.
template <class T>
void rmsnorm_backward(const T* x, const float* w, int rows, int dim, float eps, const T* dy, T* dx, T* dw);

// ---- RoPE ---------------------------------------------------------------------------------------------

/// Rotates every head of every row by its position's angles (as kernels::cpu::rope: angles in double,
/// theta_i = pos * base^(-2i/n_dims) / factor_i); `inverse` rotates by the negated angles. The rotation is
/// orthogonal, so the backward of a rotation is the inverse rotation of the gradient.
template <class T>
void rope_rotate(T* x, int rows, int n_heads, int head_dim, const int32_t* positions,
                 const kernels::RopeParams& p, bool inverse);

// ---- SwiGLU: h = silu(g) * u ----------------------------------------------------------------------------

template <class T>
void swiglu_forward(const T* g, const T* u, size_t n, T* h);
/// dg += dL/dg, du += dL/du.
template <class T>
void swiglu_backward(const T* g, const T* u, size_t n, const T* dh, T* dg, T* du);

// ---- Linear with LoRA: y = x W^T + s (x A^T) B^T --------------------------------------------------------

/// A frozen weight (n_out rows of n_in, float) with an optional trainable LoRA pair of rank r: A has r rows
/// of n_in, B has n_out rows of r (llama.cpp's `lora_a` [n_in, r] and `lora_b` [r, n_out] in ggml order).
template <class T>
struct LinearParams {
  const float* w = nullptr;
  int n_in = 0, n_out = 0;
  const T* a = nullptr;
  const T* b = nullptr;
  int rank = 0;
  float scale = 0;  // s = alpha / rank * the adapter's scale
};

/// y = x W^T (+ s (x A^T) B^T) for `rows` rows; `xa` (rows x rank, when the pair is set) receives x A^T.
template <class T>
void linear_forward(const LinearParams<T>& p, const T* x, int rows, T* y, T* xa);
/// dx += dy W + s (dy B) A (when dx is not null); da += s (dy B)^T x, db += s dy^T (x A^T) (when set).
template <class T>
void linear_backward(const LinearParams<T>& p, const T* x, const T* xa, int rows, const T* dy, T* dx, T* da,
                     T* db);

// ---- Output: cross-entropy of next-token logits ---------------------------------------------------------

/// Sum over rows of -log softmax(logits[r])[targets[r]]; `dlogits` (when not null) += weight * d/dlogits.
template <class T>
double cross_entropy(const T* logits, int rows, int n_vocab, const int32_t* targets, T* dlogits,
                     double weight = 1.0);

// ---- Embedding ------------------------------------------------------------------------------------------

/// out[r] = table row ids[r] (table: n_vocab rows of dim, float).
template <class T>
void embedding_forward(const float* table, int dim, std::span<const int32_t> ids, T* out);
/// dtable[ids[r]] += dout[r].
template <class T>
void embedding_backward(int dim, std::span<const int32_t> ids, const T* dout, T* dtable);

// ---- Segment attention ----------------------------------------------------------------------------------

/// One segment of a call's view: n_tokens keys and values (rows of n_kv_heads * head_dim, keys rotated at
/// their encoded positions), placed `delta` positions later; causal_base as kernels::KvSegment.
template <class T>
struct Segment {
  const T* k = nullptr;
  const T* v = nullptr;
  int n_tokens = 0;
  int delta = 0;
  int causal_base = -1;
};

struct AttentionShape {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  kernels::RopeParams rope;
};

/// o = softmax(q_seg k^T / sqrt(head_dim)) v over every segment together, for `rows` query rows (q: rows of
/// n_heads * head_dim, NOT rotated; row i is at positions[i] and is rotated per segment by
/// positions[i] - delta). `lse` (rows x n_heads) receives each row's and head's log-sum-exp of the scaled
/// scores, which the backward reuses. A row that sees no key gets zeros.
template <class T>
void attention_forward(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                       std::span<const Segment<T>> segments, T* o, T* lse);

/// The gradients of one segment's keys and values (rows of n_kv_heads * head_dim), added to.
template <class T>
struct SegmentGrad {
  T* dk = nullptr;
  T* dv = nullptr;
};

/// dq += dL/dq (of the unrotated queries), and each segment's dk, dv += their gradients (dk of the rotated
/// keys as stored). Needs the forward's o and lse.
template <class T>
void attention_backward(const AttentionShape& s, const T* q, const int32_t* positions, int rows,
                        std::span<const Segment<T>> segments, const T* o, const T* lse, const T* dout, T* dq,
                        std::span<const SegmentGrad<T>> grads);

}  // namespace choreo::train
