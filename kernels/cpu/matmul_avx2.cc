// Matrix products with AVX2, FMA and F16C (processors without AVX-512 VNNI).
//
// Same plan as matmul_avx512.cc with 8-row panels, but without VNNI and with only 16 vector registers:
// weights are re-laid as signed 16-bit pairs (one 32-byte vector = values 2h, 2h+1 of each of 8 rows) and
// multiplied with `vpmaddwd` against broadcast pairs of 16-bit activations. Products of two 16-bit values
// cannot saturate, so no offset or correction is needed.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

namespace choreo::kernels::cpu {

namespace {

constexpr int kPanelRows = 8;
constexpr int kChunkBlocks = 8;
constexpr size_t kPanelWeightBytes = 512;  // 16 pairs x 8 rows x 2 values x 2 bytes, per block

size_t panel_block_bytes(bool has_minimum) { return kPanelWeightBytes + 32 + (has_minimum ? 32 : 0); }

float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

int32_t horizontal_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The nearest fp16 value (F16C rounds to nearest even, as fp32_to_fp16 does).
float round_to_half(float value) { return _cvtsh_ss(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT)); }

// ---- activations: the reference quantiser's values, stored as 16-bit integers ---------------------------

void quantize_activation_row(const float* x, int64_t n_in, int16_t* values, ActivationBlock* blocks) {
  const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < n_in / kQuantBlock; ++b, x += kQuantBlock, values += kQuantBlock) {
    __m256 v[4];
    __m256 max_abs_lanes = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      max_abs_lanes = _mm256_max_ps(max_abs_lanes, _mm256_and_ps(v[i], magnitude_mask));
    }
    const float max_abs = horizontal_max(max_abs_lanes);
    const __m256 inverse = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));  // nearest even
    for (int i = 0; i < 4; i += 2) {
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[i], q[i + 1]), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + 8 * i), packed);
    }
    const int32_t sum =
        horizontal_sum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    const float scale = max_abs / 127.0f;
    blocks[b] = {round_to_half(scale), 0, round_to_half(scale * static_cast<float>(sum)), sum};
  }
}

// ---- re-laying quantised weights into panels ---------------------------------------------------------

/// The 8 weight rows of one panel; rows past the end of the matrix repeat the last row.
struct PanelRows {
  const uint8_t* row[kPanelRows];
};

PanelRows panel_rows(const Weight& w, int64_t first_row) {
  PanelRows rows;
  for (int i = 0; i < kPanelRows; ++i) {
    const int64_t r = std::min<int64_t>(first_row + i, w.n_out - 1);
    rows.row[i] = static_cast<const uint8_t*>(w.data) + r * w.row_stride;
  }
  return rows;
}

// out[j] = word j of rows r[0..7] (an 8x8 transpose of 32-bit words).
void transpose_8x8(const __m256i r[8], uint8_t* out) {
  __m256i t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_epi32(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_epi32(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);
    u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
    u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
    u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * i),
                       _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * (i + 4)),
                       _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
  }
}

void relay_block(DType type, const PanelRows& rows, int64_t block, uint8_t* out) {
  __m256i first_half[8], second_half[8];  // values 0..15 and 16..31 of each row, as 16-bit pairs
  float scales[kPanelRows], minimums[kPanelRows];
  for (int i = 0; i < kPanelRows; ++i) {
    if (type == DType::Q8_0) {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(rows.row[i]) + block;
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
      first_half[i] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
      second_half[i] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
      scales[i] = _cvtsh_ss(b->d);
    } else {
      const uint8_t* nibbles;
      __m128i offset = _mm_setzero_si128();
      if (type == DType::Q4_0) {
        const auto* b = reinterpret_cast<const BlockQ4_0*>(rows.row[i]) + block;
        nibbles = b->qs;
        scales[i] = _cvtsh_ss(b->d);
        offset = _mm_set1_epi8(8);
      } else {
        const auto* b = reinterpret_cast<const BlockQ4_1*>(rows.row[i]) + block;
        nibbles = b->qs;
        scales[i] = _cvtsh_ss(b->d);
        minimums[i] = _cvtsh_ss(b->m);
      }
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibbles));
      const __m128i mask = _mm_set1_epi8(0x0f);
      const __m128i low = _mm_sub_epi8(_mm_and_si128(q, mask), offset);
      const __m128i high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), offset);
      first_half[i] = _mm256_cvtepi8_epi16(low);
      second_half[i] = _mm256_cvtepi8_epi16(high);
    }
  }
  transpose_8x8(first_half, out);
  transpose_8x8(second_half, out + 256);
  _mm256_store_ps(reinterpret_cast<float*>(out + kPanelWeightBytes), _mm256_loadu_ps(scales));
  if (type == DType::Q4_1) {
    _mm256_store_ps(reinterpret_cast<float*>(out + kPanelWeightBytes + 32), _mm256_loadu_ps(minimums));
  }
}

// ---- the quantised micro-kernel -----------------------------------------------------------------------

/// One re-laid chunk of a panel (8 weight rows) times C activation rows.
struct ChunkTile {
  const uint8_t* panels;
  int n_blocks;
  const int16_t* x_values;
  const ActivationBlock* x_blocks;
  int64_t x_row_values;
  int64_t x_row_blocks;
  float* y;
  int64_t y_row_stride;
  __m256i row_mask;  // valid rows of the panel
  bool first_chunk;
};

template <int C, bool kMinimum>
void chunk_kernel(const ChunkTile& t) {
  const size_t block_bytes = panel_block_bytes(kMinimum);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) {
    acc[c] = t.first_chunk ? _mm256_setzero_ps() : _mm256_maskload_ps(t.y + c * t.y_row_stride, t.row_mask);
  }
  for (int b = 0; b < t.n_blocks; ++b) {
    const uint8_t* panel_block = t.panels + b * block_bytes;
    __m256i sums[C];
    for (int c = 0; c < C; ++c) sums[c] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int h = 0; h < 16; ++h) {
      const __m256i weights = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel_block + 32 * h));
      for (int c = 0; c < C; ++c) {
        int32_t pair;
        std::memcpy(&pair, t.x_values + c * t.x_row_values + b * kQuantBlock + 2 * h, 4);
        sums[c] = _mm256_add_epi32(sums[c], _mm256_madd_epi16(weights, _mm256_set1_epi32(pair)));
      }
    }
    const __m256 scale = _mm256_load_ps(reinterpret_cast<const float*>(panel_block + kPanelWeightBytes));
    for (int c = 0; c < C; ++c) {
      const ActivationBlock& xb = t.x_blocks[c * t.x_row_blocks + b];
      acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[c]), _mm256_mul_ps(scale, _mm256_set1_ps(xb.scale)),
                               acc[c]);
      if constexpr (kMinimum) {
        const __m256 minimum =
            _mm256_load_ps(reinterpret_cast<const float*>(panel_block + kPanelWeightBytes + 32));
        acc[c] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(xb.scaled_sum), acc[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) _mm256_maskstore_ps(t.y + c * t.y_row_stride, t.row_mask, acc[c]);
}

using ChunkKernel = void (*)(const ChunkTile&);

template <bool kMinimum>
ChunkKernel pick_chunk_kernel(int c) {
  static constexpr ChunkKernel table[4] = {chunk_kernel<1, kMinimum>, chunk_kernel<2, kMinimum>,
                                           chunk_kernel<3, kMinimum>, chunk_kernel<4, kMinimum>};
  return table[c - 1];
}

__m256i row_mask(int64_t valid_rows) {
  alignas(32) int32_t lanes[kPanelRows];
  for (int i = 0; i < kPanelRows; ++i) lanes[i] = i < valid_rows ? -1 : 0;
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
}

void matmul_quantized(const Weight& w, const float* x, int n, float* y) {
  const int64_t n_in = w.n_in, n_blocks = n_in / kQuantBlock, n_out = w.n_out;
  std::byte* memory = thread_scratch(ScratchSlot::Activations)
                          .reserve(static_cast<size_t>(n) * (2 * n_in + n_blocks * sizeof(ActivationBlock)));
  auto* x_blocks = reinterpret_cast<ActivationBlock*>(memory);
  auto* x_values = reinterpret_cast<int16_t*>(x_blocks + n * n_blocks);
  const bool has_minimum = w.type == DType::Q4_1;
  const size_t block_bytes = panel_block_bytes(has_minimum);
  const int max_columns = 4;
  const int64_t n_panels = (n_out + kPanelRows - 1) / kPanelRows;

  const auto quantize_rows = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      quantize_activation_row(x + c * n_in, n_in, x_values + c * n_in, x_blocks + c * n_blocks);
    }
  };
  ThreadPool& pool = kernel_pool();
  if (n > 4) {  // a few rows are quicker here than shared out at the cost of one more loop
    pool.parallel_for(n, pool.grain_for(n, 1), quantize_rows);
  } else {
    quantize_rows(0, n);
  }
  pool.parallel_for(n_panels, matmul_grain(w, n_panels, kPanelRows, n), [&](int64_t begin, int64_t end) {
    auto* buffer =
        reinterpret_cast<uint8_t*>(thread_scratch(ScratchSlot::Panels).reserve(kChunkBlocks * block_bytes));
    const WorkRange panels{begin, end};
    for (int64_t p = panels.begin; p < panels.end; ++p) {
      ChunkTile tile{};
      tile.panels = buffer;
      tile.x_row_values = n_in;
      tile.x_row_blocks = n_blocks;
      tile.y_row_stride = n_out;
      const int64_t first_row = p * kPanelRows;
      const PanelRows rows = panel_rows(w, first_row);
      tile.row_mask = row_mask(n_out - first_row);
      // Prefetch the next panel's rows (one contiguous range) a slice per chunk; see matmul_avx512.cc.
      const int64_t next_first_row = std::min<int64_t>(first_row + kPanelRows, n_out);
      const int64_t next_end_row = std::min<int64_t>(std::min(p + 2, panels.end) * kPanelRows, n_out);
      const uint8_t* next = static_cast<const uint8_t*>(w.data) + next_first_row * w.row_stride;
      const size_t next_bytes =
          static_cast<size_t>(std::max<int64_t>(next_end_row - next_first_row, 0)) * w.row_stride;
      const size_t n_chunks = static_cast<size_t>((n_blocks + kChunkBlocks - 1) / kChunkBlocks);
      const size_t slice_bytes = (next_bytes / n_chunks + 63) / 64 * 64;
      for (int64_t k0 = 0; k0 < n_blocks; k0 += kChunkBlocks) {
        const int chunk = static_cast<int>(std::min<int64_t>(kChunkBlocks, n_blocks - k0));
        const size_t slice_begin = static_cast<size_t>(k0 / kChunkBlocks) * slice_bytes;
        for (size_t offset = slice_begin; offset < std::min(next_bytes, slice_begin + slice_bytes);
             offset += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(next + offset), _MM_HINT_T0);
        }
        for (int b = 0; b < chunk; ++b) relay_block(w.type, rows, k0 + b, buffer + b * block_bytes);
        tile.n_blocks = chunk;
        tile.first_chunk = k0 == 0;
        for (int c0 = 0; c0 < n; c0 += max_columns) {
          const int columns = std::min(max_columns, n - c0);
          tile.x_values = x_values + c0 * n_in + k0 * kQuantBlock;
          tile.x_blocks = x_blocks + c0 * n_blocks + k0;
          tile.y = y + c0 * n_out + first_row;
          (has_minimum ? pick_chunk_kernel<true>(columns) : pick_chunk_kernel<false>(columns))(tile);
        }
      }
    }
  });
}

// ---- float weights ----------------------------------------------------------------------------------

template <DType T>
__m256 load_weights(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (T == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  } else {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  }
}

template <DType T>
float load_weight(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::F32) return reinterpret_cast<const float*>(row)[i];
  if constexpr (T == DType::F16) return _cvtsh_ss(reinterpret_cast<const uint16_t*>(row)[i]);
  return bf16_to_fp32(reinterpret_cast<const uint16_t*>(row)[i]);
}

template <DType T, int R, int C>
void float_tile(const Weight& w, int64_t row, const float* x, int c0, float* y) {
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint8_t*>(w.data) + (row + r) * w.row_stride;
  const int64_t n_in = w.n_in;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= n_in; i += 8) {
    __m256 weights[R];
    for (int r = 0; r < R; ++r) weights[r] = load_weights<T>(rows[r], i);
    for (int c = 0; c < C; ++c) {
      const __m256 xv = _mm256_loadu_ps(x + (c0 + c) * n_in + i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(weights[r], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float sum = horizontal_sum(acc[r][c]);
      for (int64_t j = i; j < n_in; ++j) sum += load_weight<T>(rows[r], j) * x[(c0 + c) * n_in + j];
      y[(c0 + c) * w.n_out + row + r] = sum;
    }
  }
}

template <DType T>
void matmul_float_typed(const Weight& w, const float* x, int n, float* y) {
  constexpr int64_t kUnitRows = 16;  // 64 bytes of output per unit: threads never share a cache line
  const int64_t n_units = (w.n_out + kUnitRows - 1) / kUnitRows;
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n_units, matmul_grain(w, n_units, kUnitRows, n), [&](int64_t begin, int64_t end) {
    const int64_t row_end = std::min(w.n_out, end * kUnitRows);
    for (int64_t row = begin * kUnitRows; row < row_end;) {
      const bool four = row + 4 <= row_end;
      int c = 0;
      for (; c + 2 <= n; c += 2)
        four ? float_tile<T, 4, 2>(w, row, x, c, y) : float_tile<T, 1, 2>(w, row, x, c, y);
      for (; c < n; ++c) four ? float_tile<T, 4, 1>(w, row, x, c, y) : float_tile<T, 1, 1>(w, row, x, c, y);
      row += four ? 4 : 1;
    }
  });
}

}  // namespace

void matmul_avx2(const Weight& w, const float* x, int n, float* y) {
  switch (w.type) {
    case DType::F32:
      return matmul_float_typed<DType::F32>(w, x, n, y);
    case DType::F16:
      return matmul_float_typed<DType::F16>(w, x, n, y);
    case DType::BF16:
      return matmul_float_typed<DType::BF16>(w, x, n, y);
    default:
      return matmul_quantized(w, x, n, y);
  }
}

}  // namespace choreo::kernels::cpu
