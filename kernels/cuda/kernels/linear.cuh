#pragma once
// Matrix products of activations by GGUF weights as a CUDA kernel (issue 14), written against
// kernels/cuda/portable.h: y[r, o] = sum_k W[o, k] x[r, k], reading the weight in its stored format (F32, F16,
// BF16 rows, or Q8_0 / Q4_0 / Q4_1 blocks dequantised on the fly), with f32 activations and f32 sums.
//
// One warp per output element and group of 16 rows: lane t sums k = t, t + 32, t + 64, ... in order, then the
// lanes' sums meet in the fixed xor-shuffle tree of cu::warp_sum. The order of every sum depends only on n_in, never on how many rows run together or
// where a row sits in the batch, so a row's bits are the same alone and in any batch (batch invariance, as
// the CPU backend's products and the attention kernels keep it).

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/device.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// Outputs per block of the product (warps of a 256-thread block), and rows per pass of a warp: each lane keeps
/// one partial sum per row of the pass, so a weight element read once serves kLinearRows rows.
inline constexpr int kLinearWarps = 8;
inline constexpr int kLinearRows = 16;

/// The product's grid for n rows: blocks of 8 outputs (x), and groups of 16 rows (y, at most 65,535; the
/// kernel strides over the rest).
CHOREO_HOST_DEVICE inline unsigned linear_output_blocks(int n_out) { return unsigned((n_out + kLinearWarps - 1) / kLinearWarps); }
CHOREO_HOST_DEVICE inline unsigned linear_row_groups(int n) {
  const int groups = (n + kLinearRows - 1) / kLinearRows;
  return unsigned(groups < 65535 ? groups : 65535);
}

/// Element k of row o, dequantised exactly as kernels/quant.cc does.
CHOREO_DEVICE inline float weight_element(const WeightArgs& w, cu::Ptr<const float> f32, cu::Ptr<const uint8_t> bytes,
                                          int o, int k) {
  const size_t row = size_t(o) * w.row_stride;
  switch (w.format) {
    case WeightFormat::F32:
      return f32[(row / 4) + size_t(k)];
    case WeightFormat::F16:
    case WeightFormat::BF16: {
      const size_t at = row + 2 * size_t(k);
      const uint32_t h = uint32_t(bytes[at]) | uint32_t(bytes[at + 1]) << 8;
      return w.format == WeightFormat::F16 ? half_to_float(h) : cu::bits_to_float(h << 16);
    }
    default: {
      const BlockFormat f = w.format == WeightFormat::Q8_0 ? BlockFormat::Q8_0
                            : w.format == WeightFormat::Q4_0 ? BlockFormat::Q4_0
                                                             : BlockFormat::Q4_1;
      return block_element(bytes, f, row + size_t(k / 32) * size_t(block_bytes(f)), k % 32);
    }
  }
}

/// y = x · W^T for n rows of x ([n, n_in]) into y ([n, n_out]). Grid (ceil(n_out / 8), up to ceil(n / 16)),
/// 256 threads: warp w of block (bx, by) computes output bx * 8 + w of the row groups by, by + gridDim.y, ...
/// (16 rows each). Every lane takes part in the shuffles, also past n_out.
CHOREO_GLOBAL void linear(WeightArgs w, cu::Ptr<const float> f32, cu::Ptr<const uint8_t> bytes, cu::Ptr<const float> x,
                          int n, cu::Ptr<float> y) {
  const int lane = int(cu::lane_id());
  const int o = int(cu::block_idx().x) * kLinearWarps + int(cu::thread_idx().x) / 32;
  const bool active = o < w.n_out;
  for (int r0 = int(cu::block_idx().y) * kLinearRows; r0 < n; r0 += int(cu::grid_dim().y) * kLinearRows) {
    const int rows = n - r0 < kLinearRows ? n - r0 : kLinearRows;
    float sum[kLinearRows];
    for (int r = 0; r < kLinearRows; ++r) sum[r] = 0.0f;
    if (active)
      for (int k = lane; k < w.n_in; k += 32) {
        const float wk = weight_element(w, f32, bytes, o, k);
        for (int r = 0; r < rows; ++r) sum[r] += wk * x[size_t(r0 + r) * size_t(w.n_in) + size_t(k)];
      }
    for (int r = 0; r < rows; ++r) {
      const float total = cu::warp_sum(sum[r]);
      if (lane == 0 && active) y[size_t(r0 + r) * size_t(w.n_out) + size_t(o)] = total;
    }
  }
}

/// out[r] = row ids[r] of the table, dequantised; one block per id.
CHOREO_GLOBAL void embed_rows(WeightArgs w, cu::Ptr<const float> f32, cu::Ptr<const uint8_t> bytes,
                              cu::Ptr<const int32_t> ids, cu::Ptr<float> out) {
  const unsigned r = cu::block_idx().x;
  for (int k = int(cu::thread_idx().x); k < w.n_in; k += int(cu::block_dim().x))
    out[size_t(r) * size_t(w.n_in) + size_t(k)] = weight_element(w, f32, bytes, ids[r], k);
}

/// x += y, elementwise (a grid-stride loop).
CHOREO_GLOBAL void add(cu::Ptr<float> x, cu::Ptr<const float> y, size_t n) {
  for (size_t i = global_index(); i < n; i += grid_stride()) x[i] = x[i] + y[i];
}

/// x *= s, elementwise (a grid-stride loop).
CHOREO_GLOBAL void scale(cu::Ptr<float> x, size_t n, float s) {
  for (size_t i = global_index(); i < n; i += grid_stride()) x[i] = x[i] * s;
}

}  // namespace choreo::cuda::kernels
