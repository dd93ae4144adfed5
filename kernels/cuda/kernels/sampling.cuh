#pragma once
// choreo's sampling helpers as CUDA kernels (issue 14), written once against kernels/cuda/portable.h: compiled
// by nvcc into the CUDA backend (kernels/cuda/sampling.cu) and by the host compiler into the block emulator.
// One block per row (blocks stride over rows beyond the grid), blockDim.x a power of two from 32 to
// kSamplingThreads. A row's results depend on its own values and the block size only (batch invariance).

#include <cstdint>

#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// The block size of the sampling kernels (their shared arrays hold one value per thread or per warp).
inline constexpr int kSamplingThreads = 256;

/// Blocks of a sampling launch over n_rows rows: one per row, at most 65,535 (the blocks then stride).
CHOREO_HOST_DEVICE inline unsigned sampling_blocks(int n_rows) {
  return unsigned(n_rows < 1 ? 1 : n_rows > 65535 ? 65535 : n_rows);
}

/// Whether (va, ia) comes before (vb, ib) in top_k's order: value descending, then index ascending. An index
/// < 0 is "no element", after everything.
CHOREO_DEVICE inline bool ranks_before(float va, int ia, float vb, int ib) {
  return ib < 0 || (ia >= 0 && (va > vb || (va == vb && ia < ib)));
}

/// Row r's k first logits in top_k's order: ids[r*k + j] and values[r*k + j]. Round j is a block-wide arg-max
/// over the elements strictly after pick j-1 in that order: each thread its strided elements, a xor
/// butterfly per warp, then the warps' winners by thread 0. The order is strict and total, so the winner does
/// not depend on the order of the comparisons.
CHOREO_GLOBAL void top_k(cu::Ptr<const float> logits, int n_rows, int n_vocab, int k, cu::Ptr<int32_t> ids,
                         cu::Ptr<float> values) {
  CHOREO_SHARED_ARRAY(float, warp_value, 32);
  CHOREO_SHARED_ARRAY(int, warp_index, 32);
  CHOREO_SHARED_ARRAY(float, pick_value, 1);
  CHOREO_SHARED_ARRAY(int, pick_index, 1);
  const int t = int(cu::thread_idx().x), threads = int(cu::block_dim().x);
  for (int r = int(cu::block_idx().x); r < n_rows; r += int(cu::grid_dim().x)) {
    const size_t row = size_t(r) * size_t(n_vocab), out = size_t(r) * size_t(k);
    float prev_value = 0.0f;
    int prev_index = -1;  // none yet: every element is after it
    for (int j = 0; j < k; ++j) {
      float best_value = 0.0f;
      int best_index = -1;
      for (int i = t; i < n_vocab; i += threads) {
        const float v = logits[row + size_t(i)];
        if ((prev_index < 0 || ranks_before(prev_value, prev_index, v, i)) && ranks_before(v, i, best_value, best_index)) {
          best_value = v;
          best_index = i;
        }
      }
      for (int m = 16; m > 0; m /= 2) {
        const float other_value = cu::shfl_xor(best_value, m);
        const int other_index = cu::shfl_xor(best_index, m);
        if (ranks_before(other_value, other_index, best_value, best_index)) {
          best_value = other_value;
          best_index = other_index;
        }
      }
      if (cu::lane_id() == 0) {
        warp_value[t / 32] = best_value;
        warp_index[t / 32] = best_index;
      }
      cu::sync_threads();
      if (t == 0) {
        for (int w = 1; w < threads / 32; ++w)
          if (ranks_before(warp_value[w], warp_index[w], best_value, best_index)) {
            best_value = warp_value[w];
            best_index = warp_index[w];
          }
        pick_value[0] = best_value;
        pick_index[0] = best_index;
        ids[out + size_t(j)] = best_index;
        values[out + size_t(j)] = best_value;
      }
      cu::sync_threads();
      prev_value = pick_value[0];
      prev_index = pick_index[0];
    }
    cu::sync_threads();  // the last pick is read before the next row's first one is written
  }
}

/// out[r, i] = exp((x[r, i] - max) / temperature) / sum over the row, the exponentials and the sum in double,
/// each result rounded once. The maximum: strided per thread, warp_max, then the warps' in warp order. The
/// sum: each thread's strided elements in order, then a fixed tree over the threads in shared memory.
CHOREO_GLOBAL void softmax(cu::Ptr<const float> x, int n_rows, int n, float temperature, cu::Ptr<float> out) {
  CHOREO_SHARED_ARRAY(float, warp_maxima, 32);
  CHOREO_SHARED_ARRAY(double, partial, kSamplingThreads);
  const int t = int(cu::thread_idx().x), threads = int(cu::block_dim().x);
  const double temp = double(temperature);
  for (int r = int(cu::block_idx().x); r < n_rows; r += int(cu::grid_dim().x)) {
    const size_t row = size_t(r) * size_t(n);
    float m = x[row];
    for (int i = t; i < n; i += threads) m = x[row + size_t(i)] > m ? x[row + size_t(i)] : m;
    m = cu::warp_max(m);
    if (cu::lane_id() == 0) warp_maxima[t / 32] = m;
    cu::sync_threads();
    for (int w = 0; w < threads / 32; ++w) m = warp_maxima[w] > m ? float(warp_maxima[w]) : m;  // every thread alike
    const double max = double(m);
    double sum = 0.0;
    for (int i = t; i < n; i += threads) sum += exp((double(x[row + size_t(i)]) - max) / temp);
    partial[t] = sum;
    cu::sync_threads();
    for (int s = threads / 2; s > 0; s /= 2) {
      if (t < s) partial[t] = partial[t] + partial[t + s];
      cu::sync_threads();
    }
    const double total = partial[0];
    for (int i = t; i < n; i += threads) out[row + size_t(i)] = float(exp((double(x[row + size_t(i)]) - max) / temp) / total);
    cu::sync_threads();  // partial[0] and warp_maxima are read before the next row writes them
  }
}

}  // namespace choreo::cuda::kernels
