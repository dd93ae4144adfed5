#pragma once
// choreo's matrix products on the CUDA backend go through one wrapper with cuBLAS's conventions (issue 14):
// column-major matrices, op(A) and op(B), leading dimensions, and strided batches, as
// cublasSgemmStridedBatched takes them. On a GPU (kernels/cuda/blas.cu, gemm_cublas) it calls cuBLAS; in
// emulation (kernels/cuda/emu/blas_emulated.cc, gemm_emulated) the same arguments go to the CPU GEMM (OpenBLAS's column-major
// cblas_sgemm, which shares cuBLAS's conventions), so the wrapper's transposes, leading dimensions and batch
// strides are exercised on the CPU. The helpers below express choreo's row-major products in those terms.

#include <cstdint>

namespace choreo::cuda::blas {

enum class Op { N, T };

/// C_i (m x n, column-major, ldc) = alpha op(A_i) op(B_i) + beta C_i for i < batch, where X_i = X + i * stride_x.
struct Gemm {
  Op op_a = Op::N, op_b = Op::N;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int lda = 0;
  int64_t stride_a = 0;
  const float* b = nullptr;
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

/// The product on the CPU (emulation): check(g), then OpenBLAS's column-major SGEMM per batch entry. On a GPU,
/// cuda_kernels.h's gemm_cublas takes the same Gemm to cublasSgemmStridedBatched.
void gemm_emulated(const Gemm& g);

/// y (rows x n_out, row-major) = x (rows x n_in, row-major) W^T, W row-major n_out x n_in (choreo's weight
/// layout), accumulating into y when `accumulate`. In column-major terms: y^T = W x^T, that is
/// C (n_out x rows) = op_T(W as n_in x n_out) x^T (n_in x rows).
Gemm linear(const float* w, int n_out, int n_in, const float* x, int rows, float* y, bool accumulate = false);

/// For each of `heads` heads h: scores_h (rows x keys, row-major) = scale q_h k_h^T, q_h the rows' head h
/// (row stride q_stride floats, head h at h * head_dim) and k_h the keys' (row stride k_stride, head h at
/// h * head_dim); scores_h at scores + h * rows * keys. One strided batched product.
Gemm head_scores(const float* q, int rows, int q_stride, const float* k, int keys, int k_stride, int heads, int head_dim,
                 float scale, float* scores);

}  // namespace choreo::cuda::blas
