// The CUDA backend's matrix-product wrapper (kernels/cuda/blas.h) in emulation (issue 14): choreo's row-major
// products expressed in cuBLAS's column-major conventions (transposes, leading dimensions, strided batches,
// f32/f16/bf16 operands) give what the CPU backend and a float64 loop give, a row's bits do not depend on
// where it sits in the product, and arguments cuBLAS would reject are rejected.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/quant.h"
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

TEST_CASE("cuda blas (emulated): f16 and bf16 operands with padded leading dimensions, and a row's bits wherever it sits") {
  const int n_out = 21, n_in = 70, ld = 80, rows = 40;
  const std::vector<float> w = random_values(size_t(n_out) * ld, 11), x = random_values(size_t(rows) * n_in, 12);
  for (const auto& [type, dtype] : {std::pair{blas::Type::F16, ::choreo::kernels::DType::F16},
                                    std::pair{blas::Type::BF16, ::choreo::kernels::DType::BF16}}) {
    CAPTURE(int(type));
    // The operands stored in the type, and what they hold, widened.
    const auto narrow = [&](const std::vector<float>& v, std::vector<float>& widened) {
      std::vector<uint16_t> bits(v.size());
      ::choreo::kernels::quantize_row(dtype, v.data(), bits.data(), int64_t(v.size()));
      widened.resize(v.size());
      ::choreo::kernels::dequantize_row(dtype, bits.data(), widened.data(), int64_t(v.size()));
      return bits;
    };
    std::vector<float> w_held, x_held;
    const std::vector<uint16_t> w_bits = narrow(w, w_held), x_bits = narrow(x, x_held);
    std::vector<float> y(size_t(rows) * n_out);
    blas::gemm_emulated(blas::linear(w_bits.data(), n_out, n_in, x_bits.data(), rows, y.data(), false, type, ld));
    double worst = 0;
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < n_out; ++o) {
        double want = 0, magnitude = 0;
        for (int k = 0; k < n_in; ++k) {
          const double term = double(w_held[size_t(o) * ld + k]) * double(x_held[size_t(r) * n_in + k]);
          want += term;
          magnitude += std::abs(term);
        }
        worst = std::max(worst, std::abs(y[size_t(r) * n_out + o] - want) / magnitude);
      }
    CHECK(worst < n_in * 0x1p-24);
    // Row 7 alone, and at rows 0 and 39 of a product of other rows: the same bits.
    std::vector<float> alone(n_out);
    blas::gemm_emulated(blas::linear(w_bits.data(), n_out, n_in, x_bits.data() + 7 * n_in, 1, alone.data(), false, type, ld));
    CHECK(std::memcmp(alone.data(), y.data() + 7 * n_out, sizeof(float) * n_out) == 0);
    std::vector<uint16_t> moved(x_bits.rbegin(), x_bits.rend());
    std::copy_n(x_bits.begin() + 7 * n_in, n_in, moved.begin());
    std::copy_n(x_bits.begin() + 7 * n_in, n_in, moved.end() - n_in);
    std::vector<float> y_moved(y.size());
    blas::gemm_emulated(blas::linear(w_bits.data(), n_out, n_in, moved.data(), rows, y_moved.data(), false, type, ld));
    CHECK(std::memcmp(y_moved.data(), alone.data(), sizeof(float) * n_out) == 0);
    CHECK(std::memcmp(y_moved.data() + (rows - 1) * n_out, alone.data(), sizeof(float) * n_out) == 0);
  }
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
