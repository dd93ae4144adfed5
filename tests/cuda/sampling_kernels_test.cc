// The sampling kernels (kernels/cuda/kernels/sampling.cuh) launched directly in the block emulator over more
// rows than a grid has blocks (65,535): the blocks stride, and every row is computed. (Their results are
// checked row by row against references in tests/kernels/sampling_test.cc, through the backends.)

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/kernels/sampling.cuh"

namespace choreo::cuda {
namespace {

using cu::make_ptr;

TEST_CASE("cuda kernels (emulated): top_k and softmax stride over 70,000 rows, more than a grid's 65,535 blocks") {
  const int rows = 70000, n = 3, k = 2;
  REQUIRE(kernels::sampling_blocks(rows) == 65535u);
  std::vector<float> x(size_t(rows) * n);
  for (int r = 0; r < rows; ++r)  // row r: its largest value at index r % 3, the next at (r + 1) % 3
    for (int i = 0; i < n; ++i) x[size_t(r) * n + size_t((r + i) % n)] = float(n - i) + float(r % 5);
  std::vector<int32_t> ids(size_t(rows) * k, -1);
  std::vector<float> values(size_t(rows) * k, -1.0f), probs(size_t(rows) * n, -1.0f);
  // One warp per block: the kernels take any power of two from 32 threads up.
  cu::launch("top_k", kernels::top_k, Dim3(kernels::sampling_blocks(rows)), Dim3(32), 0, nullptr,
             make_ptr(x.data(), x.size()), rows, n, k, make_ptr(ids.data(), ids.size()), make_ptr(values.data(), values.size()));
  cu::launch("softmax", kernels::softmax, Dim3(kernels::sampling_blocks(rows)), Dim3(32), 0, nullptr,
             make_ptr(x.data(), x.size()), rows, n, 1.0f, make_ptr(probs.data(), probs.size()));
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), total = 1.0 + e1 + e2;
  bool picks = true, softmax = true;
  for (int r = 0; r < rows; ++r) {
    picks = picks && ids[size_t(r) * k] == r % n && ids[size_t(r) * k + 1] == (r + 1) % n &&
            values[size_t(r) * k] == float(n + r % 5) && values[size_t(r) * k + 1] == float(n - 1 + r % 5);
    softmax = softmax && std::abs(probs[size_t(r) * n + size_t(r % n)] - 1.0 / total) <= 1e-7 &&
              std::abs(probs[size_t(r) * n + size_t((r + 2) % n)] - e2 / total) <= 1e-7;
  }
  CHECK(picks);
  CHECK(softmax);
}

}  // namespace
}  // namespace choreo::cuda
