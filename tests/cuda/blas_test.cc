// The CUDA backend's matrix-product wrapper (kernels/cuda/blas.h) in emulation (issue 14): choreo's row-major
// products expressed in cuBLAS's column-major conventions (transposes, leading dimensions, strided batches)
// give what the CPU backend and a float64 loop give, and arguments cuBLAS would reject are rejected.

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/blas.h"
#include "tests/cuda/random_values.h"

namespace choreo::cuda {
namespace {

using testing::random_values;

TEST_CASE("cuda blas (emulated): a linear layer in cuBLAS's conventions equals the CPU backend's matmul") {
  std::unique_ptr<::choreo::kernels::Backend> cpu = ::choreo::kernels::make_cpu_backend(1);
  for (const auto& [n_out, n_in, rows] : {std::tuple{96, 576, 7}, std::tuple{1536, 576, 1}, std::tuple{64, 64, 33}}) {
    const std::vector<float> w = random_values(size_t(n_out) * n_in, 1), x = random_values(size_t(rows) * n_in, 2);
    ::choreo::kernels::Weight weight;
    weight.type = ::choreo::kernels::DType::F32;
    weight.n_out = n_out;
    weight.n_in = n_in;
    weight.row_stride = size_t(n_in) * sizeof(float);
    weight.data = w.data();
    std::vector<float> want(size_t(rows) * n_out), got(want.size(), 5.0f);
    cpu->matmul(weight, x.data(), rows, want.data());
    blas::gemm_emulated(blas::linear(w.data(), n_out, n_in, x.data(), rows, got.data()));
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
    CAPTURE(n_out);
    CHECK(worst < 1e-4);
    // Accumulating adds the product to what y holds.
    std::vector<float> twice = got;
    blas::gemm_emulated(blas::linear(w.data(), n_out, n_in, x.data(), rows, twice.data(), true));
    for (size_t i = 0; i < got.size(); i += 97) CHECK(twice[i] == doctest::Approx(2 * got[i]).epsilon(1e-6));
  }
}

TEST_CASE("cuda blas (emulated): per-head scores as one strided batched product equal a float64 loop") {
  const int heads = 3, head_dim = 64, rows = 5, keys = 37, q_stride = heads * head_dim + 8, k_stride = heads * head_dim;
  const std::vector<float> q = random_values(size_t(rows) * q_stride, 3), k = random_values(size_t(keys) * k_stride, 4);
  std::vector<float> scores(size_t(heads) * rows * keys, -1.0f);
  blas::gemm_emulated(blas::head_scores(q.data(), rows, q_stride, k.data(), keys, k_stride, heads, head_dim, 0.125f,
                                        scores.data()));
  double worst = 0;
  for (int h = 0; h < heads; ++h)
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < keys; ++j) {
        double dot = 0;
        for (int d = 0; d < head_dim; ++d)
          dot += double(q[size_t(r) * q_stride + size_t(h) * head_dim + d]) * k[size_t(j) * k_stride + size_t(h) * head_dim + d];
        worst = std::max(worst, std::abs(0.125 * dot - scores[(size_t(h) * rows + r) * keys + j]));
      }
  CHECK(worst < 1e-5);
}

TEST_CASE("cuda blas (emulated): arguments cuBLAS rejects are rejected") {
  std::vector<float> a(64), b(64), c(64);
  blas::Gemm g = blas::linear(a.data(), 8, 8, b.data(), 8, c.data());
  g.lda = 4;
  CHECK_THROWS_AS(blas::gemm_emulated(g), std::invalid_argument);
  g = blas::linear(a.data(), 8, 8, b.data(), 8, c.data());
  g.ldc = 7;
  CHECK_THROWS_AS(blas::gemm_emulated(g), std::invalid_argument);
  g.ldc = 8;
  g.k = -1;
  CHECK_THROWS_AS(blas::gemm_emulated(g), std::invalid_argument);
}

}  // namespace
}  // namespace choreo::cuda
