#pragma once
// The CUDA backend's sampling helpers: top_k and softmax, one block per row (kernels/cuda/kernels/sampling.cuh).
// Part of CoreBackend (kernels/cuda/backend_core.h), the CUDA backend's host logic: compiled by nvcc for a GPU
// and by the host compiler for the block emulator.

#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/kernels/sampling.cuh"

namespace choreo::cuda {

template <class Device>
void CoreBackend<Device>::top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values) {
  choreo::kernels::check_top_k(n_rows, n_vocab, k);
  if (n_rows == 0) return;
  std::lock_guard lock(mutex_);
  const size_t picks = size_t(n_rows) * size_t(k);
  cu::launch("top_k", kernels::top_k, Dim3(kernels::sampling_blocks(n_rows)), Dim3(kernels::kSamplingThreads), 0,
             dev_->stream(), arg(logits, size_t(n_rows) * size_t(n_vocab)), n_rows, n_vocab, k, arg(ids, picks),
             arg(values, picks));
  dev_->launched("top_k");
}

template <class Device>
void CoreBackend<Device>::softmax(const float* x, int n_rows, int n, float temperature, float* out) {
  choreo::kernels::check_softmax(n_rows, n, temperature);
  if (n_rows == 0) return;
  std::lock_guard lock(mutex_);
  const size_t size = size_t(n_rows) * size_t(n);
  cu::launch("softmax", kernels::softmax, Dim3(kernels::sampling_blocks(n_rows)), Dim3(kernels::kSamplingThreads), 0,
             dev_->stream(), arg(x, size), n_rows, n, temperature, arg(out, size));
  dev_->launched("softmax");
}

}  // namespace choreo::cuda
