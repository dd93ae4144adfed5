// The emulated cuBLAS (kernels/cuda/blas.h): the same arguments, checked as cuBLAS checks them, on OpenBLAS's
// column-major SGEMM, which shares cuBLAS's conventions. On a GPU, kernels/cuda/blas.cu's gemm_cublas takes the
// same arguments.

#include <cblas.h>

#include "kernels/cuda/blas.h"

namespace choreo::cuda::blas {

void gemm_emulated(const Gemm& g) {
  check(g);
  if (g.m == 0 || g.n == 0) return;
  for (int i = 0; i < g.batch; ++i)
    cblas_sgemm(CblasColMajor, g.op_a == Op::N ? CblasNoTrans : CblasTrans, g.op_b == Op::N ? CblasNoTrans : CblasTrans,
                g.m, g.n, g.k, g.alpha, g.a + i * g.stride_a, g.lda, g.b + i * g.stride_b, g.ldb, g.beta,
                g.c + i * g.stride_c, g.ldc);
}

}  // namespace choreo::cuda::blas
