#pragma once
// The forward pass's matrix products on a GPU (issue 14): kernels/cuda/blas.h's Gemm on cuBLASLt, with one
// algorithm pinned per product shape. cuBLAS's heuristics pick an algorithm (tile shape, split-K, stream-K)
// per problem size, and the order in which an element's products are summed goes with it: the same row would
// get different bits in a batch of 1 and of 37 rows, breaking batch invariance. Here the algorithm is chosen
// once per shape without the row count (the heuristic's first choice at kReferenceRows rows, with split-K 1,
// no reduction scheme and no workspace), and every product of that shape, whatever its rows, runs with it,
// so an element's sum depends only on k. Compute type CUBLAS_COMPUTE_32F (no TF32), f32 scale and output.
// This has never run on a GPU (none was available): scripts/gpu_check.sh runs batch_invariance_test on one.

#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/cuda/blas.h"

namespace choreo::cuda {

class PinnedGemm {
 public:
  /// The row count (Gemm::n) at which a shape's algorithm is chosen.
  static constexpr int kReferenceRows = 256;

  PinnedGemm();
  ~PinnedGemm();
  PinnedGemm(const PinnedGemm&) = delete;
  PinnedGemm& operator=(const PinnedGemm&) = delete;

  /// g on `stream` (device pointers). Throws RuntimeFailure when cuBLASLt fails, or when the shape's pinned
  /// algorithm cannot take g's row count (a different algorithm would give different bits).
  void run(const blas::Gemm& g, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace choreo::cuda
