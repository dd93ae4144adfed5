// The device build of choreo's matrix-product, embedding and vector kernels (kernels/cuda/kernels/linear.cuh),
// with host entry points that launch them on a stream. The same source runs in the block emulator
// (kernels/cuda/emu/emulated_backend.cc).

#include <algorithm>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/linear.cuh"

namespace choreo::cuda {

void launch_linear(const kernels::WeightArgs& w, const void* weight, const float* x, int n, float* y,
                   cudaStream_t stream) {
  if (n <= 0) return;
  const auto* f32 = w.format == kernels::WeightFormat::F32 ? static_cast<const float*>(weight) : nullptr;
  const auto* bytes = w.format == kernels::WeightFormat::F32 ? nullptr : static_cast<const uint8_t*>(weight);
  const unsigned out_blocks = unsigned((w.n_out + kernels::kLinearWarps - 1) / kernels::kLinearWarps);
  const unsigned row_groups = unsigned(std::min(65535, (n + kernels::kLinearRows - 1) / kernels::kLinearRows));
  cu::launch("linear", kernels::linear, dim3(out_blocks, row_groups), dim3(32 * kernels::kLinearWarps), 0, stream, w,
             f32, bytes, x, n, y);
}

void launch_embed_rows(const kernels::WeightArgs& w, const void* table, const int32_t* ids, int n, float* out,
                       cudaStream_t stream) {
  const auto* f32 = w.format == kernels::WeightFormat::F32 ? static_cast<const float*>(table) : nullptr;
  const auto* bytes = w.format == kernels::WeightFormat::F32 ? nullptr : static_cast<const uint8_t*>(table);
  cu::launch("embed_rows", kernels::embed_rows, dim3(unsigned(n)), dim3(128), 0, stream, w, f32, bytes, ids, out);
}

void launch_add(float* x, const float* y, size_t n, cudaStream_t stream) {
  const unsigned blocks = unsigned(std::clamp<size_t>((n + 255) / 256, 1, 65535));
  cu::launch("add", kernels::add, dim3(blocks), dim3(256), 0, stream, x, y, n);
}

void launch_scale(float* x, size_t n, float s, cudaStream_t stream) {
  const unsigned blocks = unsigned(std::clamp<size_t>((n + 255) / 256, 1, 65535));
  cu::launch("scale", kernels::scale, dim3(blocks), dim3(256), 0, stream, x, n, s);
}

}  // namespace choreo::cuda
