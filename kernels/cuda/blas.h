#pragma once
// choreo's matrix products on the CUDA backend go through one wrapper with cuBLAS's conventions (issue 14):
// column-major matrices, op(A) and op(B), leading dimensions, and strided batches, as
// cublasGemmStridedBatchedEx and cuBLASLt take them, with A and B in f32, f16 or bf16 and C and every sum in
// f32. On a GPU the forward pass runs them through cuBLASLt with one pinned algorithm per product shape
// (kernels/cuda/device/gemm_lt.cu: split-K 1, no reduction scheme, chosen once and never per row count). In
// emulation (kernels/cuda/emu/blas_emulated.cc, gemm_emulated) the same arguments go to a CPU GEMM that
// indexes A, B and C exactly as cuBLAS does and sums every element over k in order: the contract the pinned
// algorithm must keep for batch invariance (a row's bits never depend on the other rows of the product), so
// the wrapper's transposes, leading dimensions, types and batch strides are exercised on the CPU. The helpers
// below express choreo's row-major products in those terms.

#include <cstdint>

namespace choreo::cuda::blas {

enum class Op { N, T };
/// The element type of A and B (C is f32).
enum class Type { F32, F16, BF16 };

/// C_i (m x n, column-major, ldc) = alpha op(A_i) op(B_i) + beta C_i for i < batch, where X_i = X + i * stride_x.
struct Gemm {
  Op op_a = Op::N, op_b = Op::N;
  int m = 0, n = 0, k = 0;
  Type type = Type::F32;  // of A and B
  float alpha = 1.0f;
  const void* a = nullptr;
  int lda = 0;
  int64_t stride_a = 0;
  const void* b = nullptr;
  int ldb = 0;
  int64_t stride_b = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int ldc = 0;
  int64_t stride_c = 0;
  int batch = 1;
};

/// Throws std::invalid_argument for arguments cuBLAS would reject (a negative size, a leading dimension below
/// the rows of what it holds).
void check(const Gemm& g);

/// The bytes of one element of A or B.
inline int type_bytes(Type t) { return t == Type::F32 ? 4 : 2; }

/// The product on the CPU (emulation): check(g), then C(i, j) = alpha * sum over p < k, in order, of
/// op(A)(i, p) op(B)(p, j) (each product of the operands widened to f32, summed in f32) + beta * C(i, j) (beta
/// 0: C is not read). On a GPU, device/gemm_lt.cu takes the same Gemm to cuBLASLt.
void gemm_emulated(const Gemm& g);

/// y (rows x n_out, row-major) = x (rows x n_in, row-major) W^T, W row-major n_out x n_in (choreo's weight
/// layout, rows `w_ld` elements apart; 0: n_in), accumulating into y when `accumulate`. In column-major terms:
/// y^T = W x^T, that is C (n_out x rows) = op_T(W as n_in x n_out) x^T (n_in x rows). W and x are of `type`.
Gemm linear(const void* w, int n_out, int n_in, const void* x, int rows, float* y, bool accumulate = false,
            Type type = Type::F32, int w_ld = 0);

/// For each of `heads` heads h: scores_h (rows x keys, row-major) = scale q_h k_h^T, q_h the rows' head h
/// (row stride q_stride floats, head h at h * head_dim) and k_h the keys' (row stride k_stride, head h at
/// h * head_dim); scores_h at scores + h * rows * keys. One strided batched product.
Gemm head_scores(const float* q, int rows, int q_stride, const float* k, int keys, int k_stride, int heads, int head_dim,
                 float scale, float* scores);

}  // namespace choreo::cuda::blas
