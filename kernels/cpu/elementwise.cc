#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace choreo::kernels::cpu {

#define CHOREO_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

CHOREO_MULTIVERSION
static float sum_squares(const float* x, int dim) {
  // Eight partial sums so the compiler can vectorise without -ffast-math.
  float acc[16] = {};
  int i = 0;
  for (; i + 16 <= dim; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * x[i + j];
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += acc[j];
  for (; i < dim; ++i) total += x[i] * x[i];
  return total;
}

CHOREO_MULTIVERSION
static void scale_mul(const float* x, const float* weight, float scale, int dim, float* out) {
  for (int i = 0; i < dim; ++i) out[i] = x[i] * scale * weight[i];
}

void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) {
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + size_t(r) * dim;
      float mean = sum_squares(xr, dim) / float(dim);
      scale_mul(xr, weight, 1.0f / std::sqrt(mean + eps), dim, out + size_t(r) * dim);
    }
  };
  if (n <= 8) return rows(0, n);
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n, pool.grain_for(n), rows);
}

CHOREO_MULTIVERSION
static void swiglu_range(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu(const float* gate, const float* up, size_t n, float* out) {
  constexpr size_t kChunk = 4096;
  const auto n_chunks = int64_t((n + kChunk - 1) / kChunk);
  const auto chunks = [&](int64_t first, int64_t last) {
    const size_t b = size_t(first) * kChunk, e = std::min(n, size_t(last) * kChunk);
    swiglu_range(gate + b, up + b, e - b, out + b);
  };
  if (n_chunks <= 1) return chunks(0, n_chunks);
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n_chunks, pool.grain_for(n_chunks), chunks);
}

CHOREO_MULTIVERSION
void add(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

CHOREO_MULTIVERSION
void scale(float* x, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

static void inverse_frequencies(const RopeParams& p, double* inv_freq) {
  int half = p.n_dims / 2;
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(double(p.freq_base), -2.0 * i / double(p.n_dims));
    if (p.freq_factors) inv_freq[i] /= double(p.freq_factors[i]);
  }
}

static void angles_from(int64_t pos, int half, const double* inv_freq, float* cos_out, float* sin_out) {
  // Angles in double, rounded once: theta_i = pos * base^(-2i/n_dims) / factor_i.
  for (int i = 0; i < half; ++i) {
    double theta = double(pos) * inv_freq[i];
    cos_out[i] = float(std::cos(theta));
    sin_out[i] = float(std::sin(theta));
  }
}

void rope_angles(int64_t pos, const RopeParams& p, float* cos_out, float* sin_out) {
  double inv_freq[kMaxRopePairs];
  inverse_frequencies(p, inv_freq);
  angles_from(pos, p.n_dims / 2, inv_freq, cos_out, sin_out);
}

void rotate_head(float* h, const float* c, const float* s, const RopeParams& p) {
  int half = p.n_dims / 2;
  if (p.layout == RopeParams::Layout::Interleaved) {
    for (int i = 0; i < half; ++i) {
      float x0 = h[2 * i], x1 = h[2 * i + 1];
      h[2 * i] = x0 * c[i] - x1 * s[i];
      h[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      float x0 = h[i], x1 = h[i + half];
      h[i] = x0 * c[i] - x1 * s[i];
      h[i + half] = x0 * s[i] + x1 * c[i];
    }
  }
}

void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const RopeParams& p) {
  double inv_freq[kMaxRopePairs];
  inverse_frequencies(p, inv_freq);
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float c[kMaxRopePairs], s[kMaxRopePairs];
      angles_from(pos[r], p.n_dims / 2, inv_freq, c, s);
      float* row = x + size_t(r) * n_heads * head_dim;
      for (int h = 0; h < n_heads; ++h) rotate_head(row + size_t(h) * head_dim, c, s, p);
    }
  };
  if (n <= 4) return rows(0, n);
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n, pool.grain_for(n), rows);
}

}  // namespace choreo::kernels::cpu
