#pragma once
// choreo's own elementwise CUDA kernels (issue 14), written once against kernels/cuda/portable.h: compiled by
// nvcc into the CUDA backend (kernels/cuda/*.cu) and by the host compiler into the block emulator's tests.
// Each mirrors the CPU kernel of the same name (kernels/cpu/elementwise.cc, kernels/quant.cc) operation for
// operation where the CPU's order is fixed (RoPE angles in double rounded once, dequantisation); reductions
// (RMSNorm's sum of squares) use a fixed tree whose order depends only on the block size.

#include <cstdint>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/device.cuh"
#include "kernels/cuda/kernels/rope.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one block per row of `dim`; blockDim.x a multiple of 32 up
/// to 1024. The sum of squares: each thread's strided partial sum, a shuffle tree per warp, then the warps'
/// sums in warp order by thread 0.
CHOREO_GLOBAL void rmsnorm(cu::Ptr<const float> x, cu::Ptr<const float> w, int dim, float eps, cu::Ptr<float> out) {
  CHOREO_SHARED_ARRAY(float, warp_sums, 32);
  CHOREO_SHARED_ARRAY(float, inv_rms, 1);
  const unsigned t = cu::thread_idx().x, threads = cu::block_dim().x;
  const size_t row = size_t(cu::block_idx().x) * size_t(dim);
  float ss = 0.0f;
  for (int i = int(t); i < dim; i += int(threads)) ss += x[row + i] * x[row + i];
  ss = cu::warp_sum(ss);
  if (cu::lane_id() == 0) warp_sums[t / 32] = ss;
  cu::sync_threads();
  if (t == 0) {
    float total = 0.0f;
    for (unsigned k = 0; k < threads / 32; ++k) total += warp_sums[k];
    inv_rms[0] = 1.0f / sqrtf(total / float(dim) + eps);
  }
  cu::sync_threads();
  const float s = inv_rms[0];
  for (int i = int(t); i < dim; i += int(threads)) out[row + i] = x[row + i] * s * w[i];
}

/// out = x rounded to f16 (bf16 0) or bf16 (bf16 1) bits, nearest even, over n values (a grid-stride loop):
/// the activations of a product by f16 or bf16 weights in cuBLAS, whose operands share one type.
CHOREO_GLOBAL void narrow(cu::Ptr<const float> x, size_t n, int bf16, cu::Ptr<uint16_t> out) {
  for (size_t i = global_index(); i < n; i += grid_stride())
    out[i] = uint16_t(bf16 ? float_to_bf16_bits(x[i]) : float_to_half_bits(x[i]));
}

/// out = silu(gate) * up, elementwise over n values (a grid-stride loop).
CHOREO_GLOBAL void swiglu(cu::Ptr<const float> gate, cu::Ptr<const float> up, size_t n, cu::Ptr<float> out) {
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

/// Rotates every head of every row in place: row r at position pos[r] - shift (the per-segment query
/// rotation passes a segment's placement as `shift`; `sign` -1 rotates back, as a backward pass does). One
/// block per row; threads over (head, pair). Angles in double rounded once to float, as the CPU kernel does.
CHOREO_GLOBAL void rope(cu::Ptr<float> x, int n_heads, int head_dim, cu::Ptr<const int32_t> pos, int shift, int sign,
                        RopeArgs p, cu::Ptr<const float> factors) {
  const unsigned r = cu::block_idx().x;
  const int half = p.n_dims / 2;
  const size_t row = size_t(r) * size_t(n_heads) * size_t(head_dim);
  for (int k = int(cu::thread_idx().x); k < n_heads * half; k += int(cu::block_dim().x)) {
    const int h = k / half;
    const RopePair q = rope_pair(p, factors, k % half, double(int64_t(pos[r]) - shift), sign);
    const size_t a = row + size_t(h) * head_dim + size_t(q.a), b = row + size_t(h) * head_dim + size_t(q.b);
    float x0 = x[a], x1 = x[b];
    rotate_pair(q, x0, x1);
    x[a] = x0;
    x[b] = x1;
  }
}

/// out[r] = table row ids[r] (F32 rows of dim), one block per id.
CHOREO_GLOBAL void embed_f32(cu::Ptr<const float> table, int dim, cu::Ptr<const int32_t> ids, cu::Ptr<float> out) {
  const unsigned r = cu::block_idx().x;
  const size_t src = size_t(ids[r]) * size_t(dim), dst = size_t(r) * size_t(dim);
  for (int i = int(cu::thread_idx().x); i < dim; i += int(cu::block_dim().x)) out[dst + i] = table[src + i];
}

/// ggml blocks to floats, one thread per element (a grid-stride loop).
CHOREO_GLOBAL void dequantize(cu::Ptr<const uint8_t> src, BlockFormat format, size_t n, cu::Ptr<float> dst) {
  const size_t stride = size_t(block_bytes(format));
  for (size_t i = global_index(); i < n; i += grid_stride()) dst[i] = block_element(src, format, i / 32 * stride, int(i % 32));
}

}  // namespace choreo::cuda::kernels
