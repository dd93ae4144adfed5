// The device build of choreo's matrix-product, embedding and vector kernels (kernels/cuda/kernels/linear.cuh),
// with host entry points that launch them on a stream. The same source runs in the block emulator
// (kernels/cuda/emu/emulated_backend.cc).

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/linear.cuh"

namespace choreo::cuda {

void launch_linear(const kernels::WeightArgs& w, const void* weight, const float* x, int n, float* y,
                   cudaStream_t stream) {
  if (n <= 0) return;
  const auto* f32 = w.format == kernels::WeightFormat::F32 ? static_cast<const float*>(weight) : nullptr;
  const auto* bytes = w.format == kernels::WeightFormat::F32 ? nullptr : static_cast<const uint8_t*>(weight);
  cu::launch("linear", kernels::linear, dim3(kernels::linear_output_blocks(w.n_out), kernels::linear_row_groups(n)), dim3(32 * kernels::kLinearWarps), 0, stream, w,
             f32, bytes, x, n, y);
}

void launch_embed_rows(const kernels::WeightArgs& w, const void* table, const int32_t* ids, int n, float* out,
                       cudaStream_t stream) {
  const auto* f32 = w.format == kernels::WeightFormat::F32 ? static_cast<const float*>(table) : nullptr;
  const auto* bytes = w.format == kernels::WeightFormat::F32 ? nullptr : static_cast<const uint8_t*>(table);
  cu::launch("embed_rows", kernels::embed_rows, dim3(unsigned(n)), dim3(128), 0, stream, w, f32, bytes, ids, out);
}

void launch_add(float* x, const float* y, size_t n, cudaStream_t stream) {
  cu::launch("add", kernels::add, dim3(kernels::grid_stride_blocks(n)), dim3(256), 0, stream, x, y, n);
}

void launch_scale(float* x, size_t n, float s, cudaStream_t stream) {
  cu::launch("scale", kernels::scale, dim3(kernels::grid_stride_blocks(n)), dim3(256), 0, stream, x, n, s);
}

}  // namespace choreo::cuda
