#pragma once
// The CUDA backend's LoRA update: one launch of the lora kernel per pair (kernels/cuda/kernels/lora.cuh), or
// the default two products.
// Part of CoreBackend (kernels/cuda/backend_core.h), the CUDA backend's host logic: compiled by nvcc for a GPU
// and by the host compiler for the block emulator.

#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/kernels/lora.cuh"

namespace choreo::cuda {

template <class Device>
void CoreBackend<Device>::add_lora(const Weight& a, const Weight& b, float factor, const float* x, int n, float* y,
              float* scratch) {
  choreo::kernels::check_lora(a, b, n);
  if (n == 0 || b.n_out == 0) return;
  if (!kernels::lora_reads(weight_format(a.type)) || !kernels::lora_reads(weight_format(b.type)) ||
      a.n_out > kernels::kLoraMaxRank)
    return Backend::add_lora(a, b, factor, x, n, y, scratch);
  std::lock_guard lock(mutex_);
  const WeightView va = view(a), vb = view(b);
  cu::launch("lora", kernels::lora, Dim3(kernels::lora_blocks(n)), Dim3(kernels::kLoraThreads), 0, dev_->stream(),
             kernels::LoraWeight{va.args, va.f32, va.bytes}, kernels::LoraWeight{vb.args, vb.f32, vb.bytes}, factor,
             arg(x, size_t(n) * size_t(a.n_in)), n, arg(y, size_t(n) * size_t(b.n_out)));
  dev_->launched("lora");
}

}  // namespace choreo::cuda
