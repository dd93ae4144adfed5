#pragma once
// The CUDA backend's weights and matrix products: weights uploaded as stored, F32/F16/BF16 products as
// one GEMM in cuBLAS's conventions (kernels/cuda/blas.h), the quantised formats by the linear kernel
// (kernels/cuda/kernels/linear.cuh), embedding rows (embed_rows).
// Part of CoreBackend (kernels/cuda/backend_core.h), the CUDA backend's host logic: compiled by nvcc for a GPU
// and by the host compiler for the block emulator.

#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/kernels/elementwise.cuh"
#include "kernels/cuda/kernels/linear.cuh"

namespace choreo::cuda {

template <class Device>
auto CoreBackend<Device>::upload_weight(const Weight& w) -> Weight {
  weight_format(w.type);  // refuses a format the kernels cannot read, at load
  if (w.type == DType::F32 && w.row_stride % sizeof(float) != 0)
    throw_input_error("an F32 weight whose rows are not 4-byte aligned cannot be read by the CUDA kernels");
  Weight uploaded = w;
  const size_t bytes = weight_bytes(w);
  void* memory = device_alloc(std::max<size_t>(bytes, 1));
  {
    std::lock_guard lock(mutex_);
    if (bytes > 0) dev_->upload(memory, w.data, bytes);
  }
  uploaded.packed = std::shared_ptr<const void>(memory, [dev = dev_](const void* p) { dev->release(const_cast<void*>(p)); });
  return uploaded;
}

template <class Device>
void CoreBackend<Device>::matmul(const Weight& w, const float* x, int n, float* y) {
  if (n <= 0 || w.n_out == 0) return;
  std::lock_guard lock(mutex_);
  if (const std::optional<blas::Type> t = gemm_type(w)) return gemm_product(w, *t, x, n, y);
  const WeightView v = view(w);
  cu::launch("linear", kernels::linear, Dim3(kernels::linear_output_blocks(int(w.n_out)), kernels::linear_row_groups(n)),
             Dim3(32 * kernels::kLinearWarps), 0, dev_->stream(), v.args, v.f32, v.bytes,
             arg(x, size_t(n) * size_t(w.n_in)), n, arg(y, size_t(n) * size_t(w.n_out)));
  dev_->launched("linear");
}

template <class Device>
void CoreBackend<Device>::matmul_group(std::span<const choreo::kernels::MatmulOutput> outputs, const float* x, int n) {
  for (const choreo::kernels::MatmulOutput& o : outputs) matmul(*o.w, x, n, o.y);
}

template <class Device>
void CoreBackend<Device>::embed(const Weight& table, std::span<const int32_t> ids, float* out) {
  if (ids.empty()) return;
  for (int32_t id : ids)
    if (id < 0 || id >= table.n_out)
      throw_input_error("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(table.n_out));
  std::lock_guard lock(mutex_);
  const WeightView v = view(table);
  Staging st(*this);
  const size_t at_ids = st.add(ids);
  st.commit();
  cu::launch("embed_rows", kernels::embed_rows, Dim3(unsigned(ids.size())), Dim3(128), 0, dev_->stream(), v.args, v.f32,
             v.bytes, st.template get<int32_t>(at_ids, ids.size()), arg(out, ids.size() * size_t(table.n_in)));
  dev_->launched("embed_rows");
}

template <class Device>
std::optional<blas::Type> CoreBackend<Device>::gemm_type(const Weight& w) {
  const std::optional<blas::Type> t = w.type == DType::F32    ? std::optional(blas::Type::F32)
                                      : w.type == DType::F16  ? std::optional(blas::Type::F16)
                                      : w.type == DType::BF16 ? std::optional(blas::Type::BF16)
                                                              : std::nullopt;
  if (!t || w.row_stride % size_t(blas::type_bytes(*t)) != 0) return std::nullopt;
  return t;
}

template <class Device>
void CoreBackend<Device>::gemm_product(const Weight& w, blas::Type t, const float* x, int n, float* y) {
  if (!w.packed) throw std::logic_error("a weight the CUDA backend has not uploaded (Backend::upload_weight)");
  const size_t inputs = size_t(n) * size_t(w.n_in), bytes = size_t(blas::type_bytes(t));
  checked(x, inputs, "matmul input");  // counts of elements
  checked(y, size_t(n) * size_t(w.n_out), "matmul output");
  checked(static_cast<const std::byte*>(w.packed.get()), weight_bytes(w), "weight");
  const void* operand = x;
  if (t != blas::Type::F32) {
    reserve(narrowed_, inputs * bytes);
    const cu::Ptr<uint16_t> out = cu::make_ptr(reinterpret_cast<uint16_t*>(narrowed_.memory), inputs);
    cu::launch("narrow", kernels::narrow, Dim3(kernels::grid_stride_blocks(inputs)), Dim3(256), 0, dev_->stream(),
               arg(x, inputs), inputs, t == blas::Type::BF16 ? 1 : 0, out);
    dev_->launched("narrow");
    operand = narrowed_.memory;
  }
  dev_->gemm(blas::linear(w.packed.get(), int(w.n_out), int(w.n_in), operand, n, y, false, t,
                          int(w.row_stride / bytes)));
  dev_->launched("gemm");
}

}  // namespace choreo::cuda
