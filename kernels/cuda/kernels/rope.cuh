#pragma once
// RoPE's per-pair rotation as device functions, shared by the rope kernel (elementwise.cuh), segment
// attention's per-segment query rotation (attention.cuh) and key re-rotation (rerotate.cuh). No kernels here,
// so all can include it.

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

/// A pair's values (x0, x1) rotated by its angle: the one expression of the rope kernel and of key re-rotation
/// (rerotate.cuh), so that nvcc contracts both to the same operations and their bits agree.
CHOREO_DEVICE inline void rotate_pair(const RopePair& q, float& x0, float& x1) {
  const float a = x0, b = x1;
  x0 = a * q.c - b * q.s;
  x1 = a * q.s + b * q.c;
}

}  // namespace choreo::cuda::kernels
