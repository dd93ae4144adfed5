// The device build of the sampling helpers (kernels/cuda/kernels/sampling.cuh), with host entry points that
// launch them on a stream. The same kernel source runs in the block emulator (tests/kernels/sampling_test.cc,
// through the emulated backend) and in the CUDA backend (kernels/cuda/sampling_backend.cuh).

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/sampling.cuh"

namespace choreo::cuda {

void launch_top_k(const float* logits, int rows, int n_vocab, int k, int32_t* ids, float* values, cudaStream_t stream) {
  if (rows <= 0) return;
  cu::launch("top_k", kernels::top_k, dim3(kernels::sampling_blocks(rows)), dim3(kernels::kSamplingThreads), 0, stream,
             logits, rows, n_vocab, k, ids, values);
}

void launch_softmax(const float* x, int rows, int n, float temperature, float* out, cudaStream_t stream) {
  if (rows <= 0) return;
  cu::launch("softmax", kernels::softmax, dim3(kernels::sampling_blocks(rows)), dim3(kernels::kSamplingThreads), 0,
             stream, x, rows, n, temperature, out);
}

}  // namespace choreo::cuda
