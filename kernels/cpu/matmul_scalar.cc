// The portable matrix products: the definition the SIMD levels are checked against, and the fallback
// for processors without AVX2.


#include <algorithm>
#include <cmath>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

namespace choreo::kernels::cpu {

void quantize_activation_row_scalar(const float* x, int64_t n_in, int32_t correction_per_sum, int8_t* values,
                                    ActivationBlock* blocks) {
  for (int64_t b = 0; b < n_in / kQuantBlock; ++b, x += kQuantBlock, values += kQuantBlock) {
    float max_abs = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    const float inverse = max_abs != 0.0f ? 127.0f / max_abs : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      const auto q = static_cast<int32_t>(std::lrint(x[i] * inverse));  // round to nearest even
      values[i] = static_cast<int8_t>(q);
      sum += q;
    }
    const float scale = max_abs / 127.0f;
    blocks[b] = {fp16_to_fp32(fp32_to_fp16(scale)), correction_per_sum * sum,
                 fp16_to_fp32(fp32_to_fp16(scale * static_cast<float>(sum))), sum};
  }
}

namespace {

// One weight row decoded to its true integer values and per-block scale (and minimum).
void decode_row(DType type, const uint8_t* row, int64_t n_blocks, int8_t* values, float* scales,
                float* minimums) {
  for (int64_t b = 0; b < n_blocks; ++b, values += kQuantBlock) {
    if (type == DType::Q8_0) {
      const auto* block = reinterpret_cast<const BlockQ8_0*>(row) + b;
      scales[b] = fp16_to_fp32(block->d);
      std::copy_n(block->qs, kQuantBlock, values);
    } else {
      const int offset = type == DType::Q4_0 ? 8 : 0;
      const uint8_t* nibbles;
      if (type == DType::Q4_0) {
        const auto* block = reinterpret_cast<const BlockQ4_0*>(row) + b;
        scales[b] = fp16_to_fp32(block->d);
        nibbles = block->qs;
      } else {
        const auto* block = reinterpret_cast<const BlockQ4_1*>(row) + b;
        scales[b] = fp16_to_fp32(block->d);
        minimums[b] = fp16_to_fp32(block->m);
        nibbles = block->qs;
      }
      for (int i = 0; i < kQuantBlock / 2; ++i) {
        values[i] = static_cast<int8_t>((nibbles[i] & 15) - offset);
        values[i + 16] = static_cast<int8_t>((nibbles[i] >> 4) - offset);
      }
    }
  }
}

void matmul_quantized(const Weight& w, const float* x, int n, float* y) {
  const int64_t n_in = w.n_in, n_blocks = n_in / kQuantBlock;
  std::byte* memory = thread_scratch(ScratchSlot::Activations)
                          .reserve(static_cast<size_t>(n) * (n_in + n_blocks * sizeof(ActivationBlock)));
  auto* blocks = reinterpret_cast<ActivationBlock*>(memory);
  auto* values = reinterpret_cast<int8_t*>(blocks + n * n_blocks);
  for (int c = 0; c < n; ++c) {
    quantize_activation_row_scalar(x + c * n_in, n_in, 0, values + c * n_in, blocks + c * n_blocks);
  }
  const bool has_minimum = w.type == DType::Q4_1;
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(w.n_out, matmul_grain(w, w.n_out, 1, n), [&](int64_t begin, int64_t end) {
    const WorkRange rows{begin, end};
    std::byte* row_memory = thread_scratch(ScratchSlot::Panels).reserve(n_in + 2 * n_blocks * sizeof(float));
    auto* scales = reinterpret_cast<float*>(row_memory);
    float* minimums = scales + n_blocks;
    auto* row_values = reinterpret_cast<int8_t*>(minimums + n_blocks);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      decode_row(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_stride, n_blocks, row_values, scales,
                 minimums);
      for (int c = 0; c < n; ++c) {
        const int8_t* q = values + c * n_in;
        const ActivationBlock* xb = blocks + c * n_blocks;
        float acc = 0.0f;
        for (int64_t b = 0; b < n_blocks; ++b) {
          int32_t dot = 0;
          for (int i = 0; i < kQuantBlock; ++i)
            dot += row_values[b * kQuantBlock + i] * q[b * kQuantBlock + i];
          acc = std::fma(static_cast<float>(dot), scales[b] * xb[b].scale, acc);
          if (has_minimum) acc = std::fma(minimums[b], xb[b].scaled_sum, acc);
        }
        y[c * w.n_out + r] = acc;
      }
    }
  });
}

float load_float(DType type, const void* row, int64_t i) {
  switch (type) {
    case DType::F16:
      return fp16_to_fp32(static_cast<const uint16_t*>(row)[i]);
    case DType::BF16:
      return bf16_to_fp32(static_cast<const uint16_t*>(row)[i]);
    default:
      return static_cast<const float*>(row)[i];
  }
}

void matmul_float(const Weight& w, const float* x, int n, float* y) {
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(w.n_out, matmul_grain(w, w.n_out, 1, n), [&](int64_t begin, int64_t end) {
    const WorkRange rows{begin, end};
    std::byte* row_memory = thread_scratch(ScratchSlot::Panels).reserve(w.n_in * sizeof(float));
    auto* row = reinterpret_cast<float*>(row_memory);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const void* source = static_cast<const uint8_t*>(w.data) + r * w.row_stride;
      for (int64_t i = 0; i < w.n_in; ++i) row[i] = load_float(w.type, source, i);
      for (int c = 0; c < n; ++c) {
        const float* xc = x + c * w.n_in;
        float acc = 0.0f;
        for (int64_t i = 0; i < w.n_in; ++i) acc += row[i] * xc[i];
        y[c * w.n_out + r] = acc;
      }
    }
  });
}

}  // namespace

void matmul_scalar(const Weight& w, const float* x, int n, float* y) {
  if (is_block_quantised(w.type)) {
    matmul_quantized(w, x, n, y);
  } else {
    matmul_float(w, x, n, y);
  }
}

}  // namespace choreo::kernels::cpu
