#pragma once
// Random weights stored in a GGUF format, for the CUDA emulator tests.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/quant.h"
#include "tests/cuda/random_values.h"

namespace choreo::testing {

/// n_out rows of n_in random values in [-1, 1] stored in `type` (kernels/quant.cc's encoding), row-major,
/// rows `pad_bytes` apart beyond their length (0: packed).
struct StoredWeight {
  std::vector<uint8_t> bytes;
  kernels::Weight w;
  StoredWeight(kernels::DType type, int n_out, int n_in, unsigned seed, size_t pad_bytes = 0) {
    const std::vector<float> values = random_values(size_t(n_out) * size_t(n_in), seed);
    const size_t stride = kernels::row_bytes(type, n_in) + pad_bytes;
    bytes.resize(stride * size_t(n_out));
    for (int o = 0; o < n_out; ++o)
      kernels::quantize_row(type, values.data() + size_t(o) * n_in, bytes.data() + size_t(o) * stride, n_in);
    w.type = type;
    w.data = bytes.data();
    w.n_out = n_out;
    w.n_in = n_in;
    w.row_stride = stride;
  }
  /// The values as stored (dequantised), n_out rows of n_in.
  std::vector<float> values() const {
    std::vector<float> out(size_t(w.n_out) * size_t(w.n_in));
    for (int64_t o = 0; o < w.n_out; ++o)
      kernels::dequantize_row(w.type, bytes.data() + size_t(o) * w.row_stride,
                              out.data() + size_t(o) * w.n_in, w.n_in);
    return out;
  }
};

}  // namespace choreo::testing
