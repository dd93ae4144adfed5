// The device build of choreo's elementwise kernels (kernels/cuda/kernels/elementwise.cuh), and host entry
// points that launch them on a stream. The same kernel source runs in the block emulator (tests/cuda).

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/elementwise.cuh"

namespace choreo::cuda {

void launch_rmsnorm(const float* x, const float* w, int rows, int dim, float eps, float* out, cudaStream_t stream) {
  cu::launch("rmsnorm", kernels::rmsnorm, dim3(unsigned(rows)), dim3(256), 0, stream, x, w, dim, eps, out);
}

void launch_swiglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t stream) {
  cu::launch("swiglu", kernels::swiglu, dim3(kernels::grid_stride_blocks(n)), dim3(256), 0, stream, gate, up, n, out);
}

void launch_rope(float* x, int rows, int n_heads, int head_dim, const int32_t* pos, int shift, int sign,
                 const kernels::RopeArgs& p, const float* factors, cudaStream_t stream) {
  cu::launch("rope", kernels::rope, dim3(unsigned(rows)), dim3(128), 0, stream, x, n_heads, head_dim, pos, shift, sign,
             p, factors);
}

void launch_embed_f32(const float* table, int dim, const int32_t* ids, int n, float* out, cudaStream_t stream) {
  cu::launch("embed_f32", kernels::embed_f32, dim3(unsigned(n)), dim3(128), 0, stream, table, dim, ids, out);
}

void launch_dequantize(const uint8_t* src, kernels::BlockFormat format, size_t n, float* dst, cudaStream_t stream) {
  cu::launch("dequantize", kernels::dequantize, dim3(kernels::grid_stride_blocks(n)), dim3(256), 0, stream, src, format, n, dst);
}

}  // namespace choreo::cuda
