// The device side of kernels/cuda/blas.h: the same Gemm arguments to cublasSgemmStridedBatched.

#include <cublas_v2.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_kernels.h"

namespace choreo::cuda {

void gemm_cublas(cublasHandle_t handle, const blas::Gemm& g) {
  blas::check(g);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const auto op = [](blas::Op o) { return o == blas::Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; };
  const cublasStatus_t s = cublasSgemmStridedBatched(handle, op(g.op_a), op(g.op_b), g.m, g.n, g.k, &g.alpha, g.a, g.lda,
                                                     g.stride_a, g.b, g.ldb, g.stride_b, &g.beta, g.c, g.ldc, g.stride_c,
                                                     g.batch);
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("cublasSgemmStridedBatched failed: " + std::string(cublasGetStatusString(s)));
}

}  // namespace choreo::cuda
