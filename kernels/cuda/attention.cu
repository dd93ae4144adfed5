// The device build of segment attention (kernels/cuda/kernels/attention.cuh): split-K partials, then the
// fixed-order combine; the tiled prefill partials (attention_tiled.cuh) as an alternative first step. The same
// kernel source runs in the block emulator (tests/cuda/attention_test.cc, attention_tiled_test.cc).

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/attention_tiled.cuh"

namespace choreo::cuda {

void launch_attention(const AttentionLaunch& a, cudaStream_t stream) {
  const dim3 parts(unsigned(a.n_q), unsigned(a.n_heads), unsigned(a.n_splits));
  cu::launch("attention_partials", kernels::attention_partials, parts, dim3(32), 0, stream, a.q, a.n_heads, a.pool,
             a.cache, a.page_list, a.segments, a.groups, a.group_of_query, a.rope, a.rope_factors, a.scale,
             a.split_tokens, a.n_splits, a.part_m, a.part_l, a.part_acc);
  cu::launch("attention_combine", kernels::attention_combine, dim3(unsigned(a.n_q), unsigned(a.n_heads)), dim3(32), 0,
             stream, a.n_heads, a.cache.head_dim, a.n_splits, a.part_m, a.part_l, a.part_acc, a.out);
}

void launch_attention_tiled(const AttentionLaunch& a, const kernels::AttnTiledBlock* blocks, int n_blocks,
                            cudaStream_t stream) {
  const size_t shared = kernels::tiled_shared_bytes(a.cache.head_dim);
  // Beyond 48 KiB (head dimensions above 168) a kernel's dynamic shared memory needs the opt-in attribute.
  if (shared > 48 * 1024)
    cudaFuncSetAttribute(kernels::attention_partials_tiled, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
  const dim3 parts(unsigned(n_blocks), unsigned(a.n_heads), unsigned(a.n_splits));
  cu::launch("attention_partials_tiled", kernels::attention_partials_tiled, parts, dim3(kernels::kTiledThreads), shared,
             stream, a.q, a.n_heads, a.pool, a.cache, a.page_list, a.segments, a.groups, blocks, a.rope,
             a.rope_factors, a.scale, a.split_tokens, a.n_splits, a.part_m, a.part_l, a.part_acc);
  cu::launch("attention_combine", kernels::attention_combine, dim3(unsigned(a.n_q), unsigned(a.n_heads)), dim3(32), 0,
             stream, a.n_heads, a.cache.head_dim, a.n_splits, a.part_m, a.part_l, a.part_acc, a.out);
}

void launch_store_kv(float* pool, const kernels::AttnCache& cache, const int32_t* pages, const int32_t* slots,
                     int n, const float* k, const float* v, cudaStream_t stream) {
  cu::launch("store_kv", kernels::store_kv, dim3(unsigned(n)), dim3(128), 0, stream, pool, cache, pages, slots, k, v);
}

}  // namespace choreo::cuda
