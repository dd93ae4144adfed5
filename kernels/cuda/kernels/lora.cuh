#pragma once
// A LoRA pair's update as one CUDA kernel (issue 14), written against kernels/cuda/portable.h: compiled by
// nvcc into the CUDA backend (kernels/cuda/lora.cu, kernels/cuda/device/cuda_backend.cu) and by the host
// compiler into the block emulator. y[i, :] += factor · B · (A · x[i, :]), A of rank rows of n_in and B of
// n_out rows of rank, both F32, F16 or BF16 rows as stored (linear.cuh's weight_element), with f32
// activations and f32 sums.
//
// Why a kernel of its own: the default (kernels::Backend::add_lora) is two products, a scale and an add
// (four operations or more) and a round trip of n × (rank + n_out) floats through device memory; here the
// rank values of a row stay in shared memory. One block per row (blocks stride over rows beyond 65,535),
// every sum in an order fixed by the shapes alone, no atomics: a row's bits never depend on the other rows of
// the call (batch invariance). Ranks above kLoraMaxRank and quantised adapters are left to the default path
// (CoreBackend::add_lora).

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/linear.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// The kernel's block size, and the largest rank it takes (its shared array of A · x).
inline constexpr int kLoraThreads = 256;
inline constexpr int kLoraMaxRank = 512;

/// Blocks of a LoRA launch over n rows: one per row, at most 65,535 (the blocks then stride).
CHOREO_HOST_DEVICE inline unsigned lora_blocks(int n) { return unsigned(n < 1 ? 1 : n > 65535 ? 65535 : n); }

/// Whether the kernel reads a weight of this format (the rest go to the default path).
CHOREO_HOST_DEVICE inline bool lora_reads(WeightFormat f) {
  return f == WeightFormat::F32 || f == WeightFormat::F16 || f == WeightFormat::BF16;
}

/// A LoRA weight as the kernel reads it: its shape and format, and its rows (f32 for F32, bytes otherwise).
struct LoraWeight {
  WeightArgs args;
  cu::Ptr<const float> f32;
  cu::Ptr<const uint8_t> bytes;
};

/// y[i, :] += factor · B · (A · x[i, :]) for n rows; a.n_out (the rank) <= kLoraMaxRank, b.n_in == a.n_out.
/// blockDim.x a multiple of 32, up to kLoraThreads. Per row:
/// 1. ranked[r] = Σ_k A[r, k] x[k] for r < rank: warp w takes r = w, w + warps, ...; lane l sums
///    k = l, l + 32, ... in order, and the lanes meet in cu::warp_sum's fixed xor tree (linear's order).
/// 2. after a barrier, thread t takes outputs j = t, t + blockDim.x, ... and adds
///    factor · Σ_r B[j, r] ranked[r] (r in order) to y[j].
/// Neither order depends on blockDim.x, so a row's bits do not either.
CHOREO_GLOBAL void lora(LoraWeight a, LoraWeight b, float factor, cu::Ptr<const float> x, int n,
                        cu::Ptr<float> y) {
  CHOREO_SHARED_ARRAY(float, ranked, kLoraMaxRank);
  const int t = int(cu::thread_idx().x), threads = int(cu::block_dim().x);
  const int lane = int(cu::lane_id()), warp = t / 32, warps = threads / 32;
  const int rank = a.args.n_out, n_in = a.args.n_in, n_out = b.args.n_out;
  for (int i = int(cu::block_idx().x); i < n; i += int(cu::grid_dim().x)) {
    const size_t in = size_t(i) * size_t(n_in), out = size_t(i) * size_t(n_out);
    // Every lane of a warp takes part in its shuffles: the loop's bound is the same for the whole warp.
    for (int r0 = 0; r0 < rank; r0 += warps) {
      const int r = r0 + warp;
      float sum = 0.0f;
      if (r < rank)
        for (int k = lane; k < n_in; k += 32)
          sum += weight_element(a.args, a.f32, a.bytes, r, k) * x[in + size_t(k)];
      sum = cu::warp_sum(sum);
      if (lane == 0 && r < rank) ranked[r] = sum;
    }
    cu::sync_threads();
    for (int j = t; j < n_out; j += threads) {
      float sum = 0.0f;
      for (int r = 0; r < rank; ++r) sum += weight_element(b.args, b.f32, b.bytes, j, r) * float(ranked[r]);
      y[out + size_t(j)] = y[out + size_t(j)] + sum * factor;
    }
    cu::sync_threads();  // ranked is read before the next row writes it
  }
}

}  // namespace choreo::cuda::kernels
