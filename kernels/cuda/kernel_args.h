#pragma once
// Plain arguments of choreo's CUDA kernels, shared by the kernel source (kernels/cuda/kernels/*.cuh), the host
// entry points (kernels/cuda/cuda_kernels.h) and the emulator's tests. No CUDA header needed.

#include <cstddef>
#include <cstdint>

namespace choreo::cuda::kernels {

/// RoPE's parameters by value (kernels::RopeParams without its pointer; the factors are a kernel argument).
struct RopeArgs {
  int n_dims = 0;
  float freq_base = 10000.0f;
  int interleaved = 1;  // adjacent pairs (llama GGUF); 0: first half with second half (NeoX)
  int has_factors = 0;  // Llama-3 scaling: n_dims/2 divisors of the frequencies in `factors`
};

/// ggml's block formats as bytes: Q8_0 (34: fp16 d, 32 x int8), Q4_0 (18: fp16 d, 16 bytes of nibbles: element
/// j low, j+16 high; x = d (q - 8)), Q4_1 (20: fp16 d, fp16 m, nibbles; x = d q + m).
enum class BlockFormat : int { Q8_0, Q4_0, Q4_1 };

}  // namespace choreo::cuda::kernels

namespace choreo::cuda::kernels {

/// Segment attention's view of the cache, flattened for a kernel (kernels::KvSegment and AttentionGroup):
/// a segment's pages are page_list[first_page, first_page + pages), each an index into the KV pool.
struct AttnSegment {
  int first_page = 0;
  int n_tokens = 0;
  int delta = 0;
  int causal_base = -1;
};
struct AttnGroup {
  int q_begin = 0, q_end = 0;
  int first_segment = 0, n_segments = 0;
};

/// KV cache types (kernels::KvLayout's k_type and v_type; llama.cpp's -ctk/-ctv).
enum class KvType : int { F32, F16, Q8_0 };

/// The KV pool as the attention and store kernels see it: pages of the kernels::KvLayout layout, page after
/// page, each its page bytes rounded up to a multiple of 4 (f32 pages need no rounding).
struct AttnCache {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, page_tokens = 0;
  int layer = 0;
  KvType k_type = KvType::F32, v_type = KvType::F32;
};

/// Formats of weight rows the matrix-product kernels read (kernels/cuda/kernels/linear.cuh).
enum class WeightFormat : int { F32, F16, BF16, Q8_0, Q4_0, Q4_1 };

/// A weight as the kernels read it: n_out rows of n_in elements, row_stride bytes apart. F32 rows are read
/// as floats (row_stride a multiple of 4), every other format as bytes.
struct WeightArgs {
  WeightFormat format = WeightFormat::F32;
  int n_out = 0, n_in = 0;
  size_t row_stride = 0;
};

}  // namespace choreo::cuda::kernels
