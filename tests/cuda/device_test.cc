// The CUDA backend on a GPU (device 0): the whole-backend checks of tests/cuda/backend_checks.h, which the
// emulated backend passes too, where the emulator cannot reach: cuBLASLt's products with their pinned algorithm
// (kernels/cuda/device/gemm_lt.cu), the kernels compiled by nvcc, device memory and streams. Each case does
// nothing on a machine without a GPU, and fails there when $CHOREO_REQUIRE_CUDA_DEVICE=1 (gpu-bundle/run.sh,
// which runs these with the conformance tests on "cuda" alone and the engine's "... on a CUDA device" cases).

#include <doctest/doctest.h>

#include <memory>

#include "kernels/backend.h"
#include "tests/cuda/backend_checks.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

TEST_CASE("cuda device: the products (cuBLASLt for F32, F16 and BF16, the linear kernel for the quantised formats) "
          "are float64 products within rounding, and batch invariant") {
  testing::LoadedModel* device = testing::stories260k_cuda_device();
  if (!device) return;
  testing::check_products(*device->backend, 96, 37);
  // A Llama-3.2-1B projection's width, and rows on both sides of the 256 the algorithm is pinned at.
  testing::check_products(*device->backend, 2048, 512, 600);
}

// The emulated backend sends these products to a CPU GEMM (kernels/cuda/emu/blas_emulated.cc), so this is the
// only check of kernels/cuda/device/gemm_lt.cu against the CPU backend; gpu-bundle/run.sh runs it as a step
// of its own, before the other device tests.
TEST_CASE(
    "cuda device: cuBLASLt's F32, F16 and BF16 products are the CPU backend's within the rounding of their "
    "types") {
  testing::LoadedModel* device = testing::stories260k_cuda_device();
  if (!device) return;
  testing::check_products_against_cpu(*device->backend, 96, 37, 5);
  testing::check_products_against_cpu(*device->backend, 2048, 512,
                                      300);  // a Llama-3.2-1B width, past 256 rows
}

TEST_CASE("cuda device: stories260K's greedy continuation and logits are the CPU backend's") {
  if (testing::LoadedModel* device = testing::stories260k_cuda_device())
    testing::check_stories260k(*device->model, "CUDA device");
}

TEST_CASE("cuda device: the head shapes of every shipped model shape give the CPU backend's logits") {
  if (!testing::stories260k_cuda_device()) return;
  testing::check_shipped_heads([] { return kernels::make_backend("cuda", 1, 0); }, "CUDA device");
}

}  // namespace
}  // namespace choreo
