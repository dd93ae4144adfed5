#pragma once
// Host entry points of choreo's CUDA kernels (kernels/cuda/*.cu): each launches one kernel of
// kernels/cuda/kernels/*.cuh on a stream, with device pointers. Built only when nvcc is found
// (CMake option CHOREO_CUDA); the kernels' logic is tested on the CPU through the block emulator (tests/cuda).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernel_args.h"

namespace choreo::cuda {

namespace kernels {
struct AttnTiledBlock;  // kernels/cuda/kernels/attention_tiled.cuh
}

void launch_rmsnorm(const float* x, const float* w, int rows, int dim, float eps, float* out, cudaStream_t stream);
void launch_swiglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t stream);
void launch_rope(float* x, int rows, int n_heads, int head_dim, const int32_t* pos, int shift, int sign,
                 const kernels::RopeArgs& p, const float* factors, cudaStream_t stream);
void launch_embed_f32(const float* table, int dim, const int32_t* ids, int n, float* out, cudaStream_t stream);
void launch_dequantize(const uint8_t* src, kernels::BlockFormat format, size_t n, float* dst, cudaStream_t stream);

/// y = x · W^T over n rows, the weight in its stored format (kernels/cuda/kernels/linear.cuh).
void launch_linear(const kernels::WeightArgs& w, const void* weight, const float* x, int n, float* y, cudaStream_t stream);
/// out[i] = row ids[i] of the table, dequantised.
void launch_embed_rows(const kernels::WeightArgs& w, const void* table, const int32_t* ids, int n, float* out,
                       cudaStream_t stream);
void launch_add(float* x, const float* y, size_t n, cudaStream_t stream);
void launch_scale(float* x, size_t n, float s, cudaStream_t stream);

/// Segment attention over an f32 KV pool (kernels/cuda/kernels/attention.cuh); every pointer is device memory.
/// part_m and part_l hold n_q * n_heads * n_splits floats, part_acc that many times head_dim.
struct AttentionLaunch {
  const float* q = nullptr;
  int n_q = 0, n_heads = 0;
  const float* pool = nullptr;
  kernels::AttnCache cache;
  const int32_t* page_list = nullptr;
  const kernels::AttnSegment* segments = nullptr;
  const kernels::AttnGroup* groups = nullptr;
  const int32_t* group_of_query = nullptr;
  kernels::RopeArgs rope;
  const float* rope_factors = nullptr;
  float scale = 1.0f;
  int split_tokens = 256, n_splits = 1;
  float *part_m = nullptr, *part_l = nullptr, *part_acc = nullptr;
  float* out = nullptr;
};
void launch_attention(const AttentionLaunch& a, cudaStream_t stream);
/// The same with the tiled prefill partials (kernels/cuda/kernels/attention_tiled.cuh): one block per
/// kernels::kTiledRows rows of a group; `blocks` (device memory) holds kernels::tiled_blocks of a.groups, n_blocks
/// of them. a.group_of_query is not read. The same bits as launch_attention.
void launch_attention_tiled(const AttentionLaunch& a, const kernels::AttnTiledBlock* blocks, int n_blocks,
                            cudaStream_t stream);
/// Writes n tokens' keys and values of cache.layer into the f32 pool at (pages[t], slots[t]).
void launch_store_kv(float* pool, const kernels::AttnCache& cache, const int32_t* pages, const int32_t* slots,
                     int n, const float* k, const float* v, cudaStream_t stream);

/// Page gather and scatter (kernels/cuda/kernels/pages.cuh): bytes [offset, offset + bytes) of each page
/// pages[i] of a pool (pages page_bytes apart) to buffer[i * bytes, ...), and back; the pages of a scatter
/// are distinct. Device pointers; in the widest word that divides page_bytes, offset and bytes.
void launch_gather_pages(const void* pool, size_t page_bytes, const int32_t* pages, int n_pages, size_t offset,
                         size_t bytes, void* buffer, cudaStream_t stream);
void launch_scatter_pages(const void* buffer, void* pool, size_t page_bytes, const int32_t* pages, int n_pages,
                          size_t offset, size_t bytes, cudaStream_t stream);

/// The sampling helpers (kernels/cuda/kernels/sampling.cuh) on device pointers: each row's k largest logits
/// (value descending, ties by the lower index) into ids and values ([rows, k]); a softmax at temperature of
/// each row of n values into out.
void launch_top_k(const float* logits, int rows, int n_vocab, int k, int32_t* ids, float* values, cudaStream_t stream);
void launch_softmax(const float* x, int rows, int n, float temperature, float* out, cudaStream_t stream);

/// A LoRA pair's update (kernels/cuda/kernels/lora.cuh) on device pointers: y[i, :] += factor · B · (A · x[i, :])
/// over n rows, A (rank rows of n_in) and B (n_out rows of rank) F32, F16 or BF16, rank <= kernels::kLoraMaxRank.
void launch_lora(const kernels::WeightArgs& a, const void* a_rows, const kernels::WeightArgs& b, const void* b_rows,
                 float factor, const float* x, int n, float* y, cudaStream_t stream);

}  // namespace choreo::cuda
