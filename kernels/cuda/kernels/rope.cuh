#pragma once
// RoPE's per-pair rotation as a device function, shared by the rope kernel (elementwise.cuh) and segment
// attention's per-segment query rotation (attention.cuh). No kernels here, so both can include it.

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// Pair i of a head under RoPE at `position`: the offsets of its two elements in the head, and the cosine and
/// sine of its angle (angles in double rounded once to float, as the CPU kernel computes them; sign -1 gives
/// the inverse rotation).
struct RopePair {
  int a, b;
  float c, s;
};
CHOREO_DEVICE inline RopePair rope_pair(const RopeArgs& p, cu::Ptr<const float> factors, int i, double position,
                                        int sign) {
  double inv_freq = pow(double(p.freq_base), -2.0 * double(i) / double(p.n_dims));
  if (p.has_factors) inv_freq /= double(factors[i]);
  const double theta = position * inv_freq;
  const int a = p.interleaved ? 2 * i : i;
  return {a, p.interleaved ? a + 1 : a + p.n_dims / 2, float(cos(theta)), float(sign) * float(sin(theta))};
}

}  // namespace choreo::cuda::kernels
