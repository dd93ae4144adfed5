#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/blas.h"

namespace choreo::cuda::blas {

void check(const Gemm& g) {
  const auto bad = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("gemm: {} (m {}, n {}, k {}, lda {}, ldb {}, ldc {}, batch {})", what, g.m,
                                            g.n, g.k, g.lda, g.ldb, g.ldc, g.batch));
  };
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) bad("a negative size");
  const int rows_a = g.op_a == Op::N ? g.m : g.k, rows_b = g.op_b == Op::N ? g.k : g.n;
  if (g.lda < std::max(1, rows_a)) bad("lda is below the rows of A");
  if (g.ldb < std::max(1, rows_b)) bad("ldb is below the rows of B");
  if (g.ldc < std::max(1, g.m)) bad("ldc is below the rows of C");
}

Gemm linear(const void* w, int n_out, int n_in, const void* x, int rows, float* y, bool accumulate, Type type, int w_ld) {
  Gemm g;
  g.type = type;
  g.op_a = Op::T;  // W row-major n_out x n_in is column-major n_in x n_out (ld n_in); op_T gives n_out x n_in
  g.op_b = Op::N;  // x row-major rows x n_in is column-major n_in x rows (ld n_in)
  g.m = n_out;
  g.n = rows;
  g.k = n_in;
  g.a = w;
  g.lda = w_ld > 0 ? w_ld : n_in;
  g.b = x;
  g.ldb = n_in;
  g.beta = accumulate ? 1.0f : 0.0f;
  g.c = y;  // column-major n_out x rows (ld n_out) is y row-major rows x n_out
  g.ldc = n_out;
  return g;
}

Gemm head_scores(const float* q, int rows, int q_stride, const float* k, int keys, int k_stride, int heads, int head_dim,
                 float scale, float* scores) {
  // Column-major: scores_h^T (keys x rows) = k_h (keys x head_dim, i.e. op_T of the column-major head_dim x keys
  // matrix with ld k_stride) times q_h^T (head_dim x rows, ld q_stride).
  Gemm g;
  g.op_a = Op::T;
  g.op_b = Op::N;
  g.m = keys;
  g.n = rows;
  g.k = head_dim;
  g.alpha = scale;
  g.a = k;
  g.lda = k_stride;
  g.stride_a = head_dim;
  g.b = q;
  g.ldb = q_stride;
  g.stride_b = head_dim;
  g.c = scores;
  g.ldc = keys;
  g.stride_c = int64_t(rows) * keys;
  g.batch = heads;
  return g;
}

}  // namespace choreo::cuda::blas
