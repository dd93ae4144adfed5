// kernels/cuda/blas.h's f32 products on cublasSgemmStridedBatched, for the self-test on a GPU
// (kernels/cuda/tools/cuda_selftest.cu). The forward pass takes its products to kernels/cuda/device/gemm_lt.cu.

#include <cublas_v2.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_kernels.h"

namespace choreo::cuda {

void gemm_cublas(cublasHandle_t handle, const blas::Gemm& g) {
  blas::check(g);
  if (g.type != blas::Type::F32) throw std::invalid_argument("gemm_cublas: f32 operands only (device/gemm_lt.cu takes f16 and bf16)");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const auto op = [](blas::Op o) { return o == blas::Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; };
  const cublasStatus_t s = cublasSgemmStridedBatched(handle, op(g.op_a), op(g.op_b), g.m, g.n, g.k, &g.alpha, static_cast<const float*>(g.a), g.lda,
                                                     g.stride_a, static_cast<const float*>(g.b), g.ldb, g.stride_b, &g.beta, g.c, g.ldc, g.stride_c,
                                                     g.batch);
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cublasSgemmStridedBatched failed: " + std::string(cublasGetStatusString(s)));
}

}  // namespace choreo::cuda
