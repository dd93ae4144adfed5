// The emulated cuBLAS (kernels/cuda/blas.h): the same arguments, checked as cuBLAS checks them, indexed as
// cuBLAS indexes them (column-major, op(A) and op(B), leading dimensions, strided batches), on a CPU GEMM
// that sums every element over k in order. That order is the contract of the pinned cuBLASLt algorithm the
// GPU runs (kernels/cuda/device/gemm_lt.cu): fixed per product shape, independent of where a row sits and of
// how many rows there are, so batch invariance is checked here through the whole forward pass.

#include <cstdint>
#include <vector>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/kernels/device.cuh"
#include "kernels/quant.h"

namespace choreo::cuda::blas {

namespace {

/// Element `index` of an operand of type T, widened to f32 (exactly).
template <Type T>
float element(const void* base, int64_t index) {
  if constexpr (T == Type::F32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (T == Type::F16) {
    return kernels::half_to_float(static_cast<const uint16_t*>(base)[index]);
  } else {
    return choreo::kernels::bf16_to_fp32(static_cast<const uint16_t*>(base)[index]);
  }
}

template <Type T>
void gemm_typed(const Gemm& g) {
  std::vector<float> column(size_t(g.k));
  for (int batch = 0; batch < g.batch; ++batch) {
    const int64_t a0 = batch * g.stride_a, b0 = batch * g.stride_b;
    float* c = g.c + batch * g.stride_c;
    for (int j = 0; j < g.n; ++j) {
      // op(B)(p, j) for every p: B(p, j) = b[p + j ldb], or B(j, p) = b[j + p ldb] when transposed.
      for (int p = 0; p < g.k; ++p)
        column[size_t(p)] = element<T>(g.b, b0 + (g.op_b == Op::N ? int64_t(p) + int64_t(j) * g.ldb : int64_t(j) + int64_t(p) * g.ldb));
      for (int i = 0; i < g.m; ++i) {
        // op(A)(i, p) = a[i + p lda], or a[p + i lda] when transposed.
        const int64_t row = g.op_a == Op::N ? a0 + i : a0 + int64_t(i) * g.lda, step = g.op_a == Op::N ? g.lda : 1;
        float sum = 0.0f;
        for (int p = 0; p < g.k; ++p) sum += element<T>(g.a, row + p * step) * column[size_t(p)];
        float& out = c[int64_t(i) + int64_t(j) * g.ldc];
        out = g.beta == 0.0f ? g.alpha * sum : g.alpha * sum + g.beta * out;
      }
    }
  }
}

}  // namespace

void gemm_emulated(const Gemm& g) {
  check(g);
  if (g.m == 0 || g.n == 0) return;
  switch (g.type) {
    case Type::F32: return gemm_typed<Type::F32>(g);
    case Type::F16: return gemm_typed<Type::F16>(g);
    case Type::BF16: return gemm_typed<Type::BF16>(g);
  }
}

}  // namespace choreo::cuda::blas
