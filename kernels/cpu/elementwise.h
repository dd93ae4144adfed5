#pragma once
// Elementwise CPU kernels (norms, activations, rotary embeddings). Compiled for several ISAs with
// function multi-versioning; the loader picks the best one for this processor at run time.

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"

namespace choreo::kernels::cpu {

/// Rotary pairs per head supported (head_dim <= 256).
inline constexpr int kMaxRopePairs = 128;

void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out);
void swiglu(const float* gate, const float* up, size_t n, float* out);
void add(float* x, const float* y, size_t n);
void scale(float* x, size_t n, float s);
/// Rotates every head of each of the n rows of x by that row's position.
void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const RopeParams& p);
/// Rotates one head vector by the angles of rope_angles (so one table serves many heads).
void rotate_head(float* head, const float* cos_table, const float* sin_table, const RopeParams& p);
/// The angle table of one position: cos/sin for each of the n_dims/2 rotation pairs.
void rope_angles(int64_t pos, const RopeParams& p, float* cos_out, float* sin_out);

}  // namespace choreo::kernels::cpu
