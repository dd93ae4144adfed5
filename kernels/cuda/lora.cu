// The device build of the LoRA kernel (kernels/cuda/kernels/lora.cuh), with a host entry point that launches
// it on a stream. The same kernel source runs in the block emulator (tests/cuda/lora_kernel_test.cc) and in
// the CUDA backend (kernels/cuda/lora_backend.cuh).

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/lora.cuh"

namespace choreo::cuda {

void launch_lora(const kernels::WeightArgs& a, const void* a_rows, const kernels::WeightArgs& b,
                 const void* b_rows, float factor, const float* x, int n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  const auto weight = [](const kernels::WeightArgs& w, const void* rows) {
    const bool f32 = w.format == kernels::WeightFormat::F32;
    return kernels::LoraWeight{w, f32 ? static_cast<const float*>(rows) : nullptr,
                               f32 ? nullptr : static_cast<const uint8_t*>(rows)};
  };
  cu::launch("lora", kernels::lora, dim3(kernels::lora_blocks(n)), dim3(kernels::kLoraThreads), 0, stream,
             weight(a, a_rows), weight(b, b_rows), factor, x, n, y);
}

}  // namespace choreo::cuda
