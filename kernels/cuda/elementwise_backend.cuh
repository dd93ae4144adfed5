#pragma once
// The CUDA backend's elementwise operations: RMSNorm, RoPE, SwiGLU, add and scale
// (kernels/cuda/kernels/elementwise.cuh).
// Part of CoreBackend (kernels/cuda/backend_core.h), the CUDA backend's host logic: compiled by nvcc for a GPU
// and by the host compiler for the block emulator.

#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/kernels/elementwise.cuh"
#include "kernels/cuda/kernels/linear.cuh"  // add, scale

namespace choreo::cuda {

template <class Device>
void CoreBackend<Device>::rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) {
  if (n <= 0) return;
  std::lock_guard lock(mutex_);
  const size_t size = size_t(n) * size_t(dim);
  cu::launch("rmsnorm", kernels::rmsnorm, Dim3(unsigned(n)), Dim3(256), 0, dev_->stream(), arg(x, size),
             arg(weight, size_t(dim)), dim, eps, arg(out, size));
  dev_->launched("rmsnorm");
}

template <class Device>
void CoreBackend<Device>::rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const choreo::kernels::RopeParams& p) {
  if (n <= 0) return;
  std::lock_guard lock(mutex_);
  Staging st(*this);
  const size_t at_pos = st.add(std::span<const int32_t>(pos, size_t(n)));
  const std::optional<size_t> at_factors = stage_factors(st, p);
  st.commit();
  cu::launch("rope", kernels::rope, Dim3(unsigned(n)), Dim3(128), 0, dev_->stream(),
             arg(x, size_t(n) * size_t(n_heads) * size_t(head_dim)), n_heads, head_dim,
             st.template get<int32_t>(at_pos, size_t(n)), 0, 1, rope_args(p), factors(st, p, at_factors));
  dev_->launched("rope");
}

template <class Device>
void CoreBackend<Device>::swiglu(const float* gate, const float* up, size_t n, float* out) {
  if (n == 0) return;
  std::lock_guard lock(mutex_);
  cu::launch("swiglu", kernels::swiglu, Dim3(kernels::grid_stride_blocks(n)), Dim3(256), 0, dev_->stream(), arg(gate, n),
             arg(up, n), n, arg(out, n));
  dev_->launched("swiglu");
}

template <class Device>
void CoreBackend<Device>::add(float* x, const float* y, size_t n) {
  if (n == 0) return;
  std::lock_guard lock(mutex_);
  cu::launch("add", kernels::add, Dim3(kernels::grid_stride_blocks(n)), Dim3(256), 0, dev_->stream(), arg(x, n), arg(y, n), n);
  dev_->launched("add");
}

template <class Device>
void CoreBackend<Device>::scale(float* x, size_t n, float s) {
  if (n == 0) return;
  std::lock_guard lock(mutex_);
  cu::launch("scale", kernels::scale, Dim3(kernels::grid_stride_blocks(n)), Dim3(256), 0, dev_->stream(), arg(x, n), n, s);
  dev_->launched("scale");
}

}  // namespace choreo::cuda
