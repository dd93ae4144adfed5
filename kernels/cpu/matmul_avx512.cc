// Matrix products with AVX-512 (F, BW, VL, DQ) and VNNI.
//
// Quantised weights: a thread takes a contiguous run of 16-row panels. For a few panels at a time and a
// chunk of kChunkBlocks blocks, it re-lays the weights into an L1-resident buffer where one 64-byte vector
// holds 4 consecutive values of each of the 16 rows (the "panel" layout), as unsigned bytes: Q4 nibbles as
// they are, Q8_0 values with their sign bit flipped (w + 128). One `vpdpbusd` of such a vector with a
// broadcast group of 4 activation bytes then advances 16 row dot products at once, with no horizontal sums;
// the unsigned offset is undone exactly by starting each block's integer sum at -8·Σq (Q4_0) or -128·Σq
// (Q8_0). Each re-laid panel chunk is reused for every activation row, so prefill pays the re-lay once per
// weight, and decode streams the weights through it once.
//
// Float weights: register tiles of 4 weight rows x up to 4 activation rows with fp32 FMA.

// GCC 12's AVX-512 headers build _mm512_undefined_*() from a self-initialised variable, which
// -Wuninitialized reports at every inlined use; the warning says nothing about this file's code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

namespace choreo::kernels::cpu {

namespace {

constexpr int kPanelRows = 16;
constexpr int kChunkBlocks = 8;
constexpr int kOnePanelRows = 8;  // activation rows up to which a thread multiplies one panel at a time
constexpr size_t kPanelWeightBytes = 512;  // 8 groups x 16 rows x 4 values, per block

size_t panel_block_bytes(bool has_minimum) { return kPanelWeightBytes + 64 + (has_minimum ? 64 : 0); }

// The nearest fp16 value (F16C rounds to nearest even, as fp32_to_fp16 does).
float round_to_half(float value) { return _cvtsh_ss(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT)); }

// ---- activations -------------------------------------------------------------------------------

void quantize_activation_row(const float* x, int64_t n_in, int32_t correction_per_sum, int8_t* values,
                             ActivationBlock* blocks) {
  const __m512 magnitude_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < n_in / kQuantBlock; ++b, x += kQuantBlock, values += kQuantBlock) {
    const __m512 low = _mm512_loadu_ps(x), high = _mm512_loadu_ps(x + 16);
    const float max_abs = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_and_ps(low, magnitude_mask), _mm512_and_ps(high, magnitude_mask)));
    const __m512 inverse = _mm512_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    const __m512i q_low = _mm512_cvtps_epi32(_mm512_mul_ps(low, inverse));  // round to nearest even
    const __m512i q_high = _mm512_cvtps_epi32(_mm512_mul_ps(high, inverse));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(values), _mm512_cvtepi32_epi8(q_low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(values + 16), _mm512_cvtepi32_epi8(q_high));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_low, q_high));
    const float scale = max_abs / 127.0f;
    blocks[b] = {round_to_half(scale), correction_per_sum * sum,
                 round_to_half(scale * static_cast<float>(sum)), sum};
  }
}

// ---- re-laying quantised weights into panels ---------------------------------------------------------

/// The 16 weight rows of one panel; rows past the end of the matrix repeat the last row (their results are
/// computed but never stored).
struct PanelRows {
  const uint8_t* row[kPanelRows];
  __m512i offsets;  // row[i] - row[0], for gathers
};

PanelRows panel_rows(const Weight& w, int64_t first_row) {
  PanelRows rows;
  alignas(64) int32_t offsets[kPanelRows];
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int i = 0; i < kPanelRows; ++i) {
    const int64_t r = std::min<int64_t>(first_row + i, w.n_out - 1);
    rows.row[i] = base + r * w.row_stride;
    offsets[i] = static_cast<int32_t>((r - first_row) * static_cast<int64_t>(w.row_stride));
  }
  rows.offsets = _mm512_load_si512(offsets);
  return rows;
}

// Transposes, within each 256-bit half, the 8x8 matrix of 32-bit words held by z[0..7] (row j of the
// matrix in z[j]); then interleaves halves so that out[g] holds word g of the 16 source rows, where z[j]'s
// low half is row j and its high half row j + 8.
[[gnu::always_inline]] inline void transpose_rows_to_groups(const __m512i z[8], __m512i out[8]) {
  __m512i t[8], u[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm512_unpacklo_epi32(z[j], z[j + 1]);
    t[j + 1] = _mm512_unpackhi_epi32(z[j], z[j + 1]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
    u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
    u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
    u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
  }
  // u[i] (i < 4) lanes: rows 0-3 word i | rows 0-3 word i+4 | rows 8-11 word i | rows 8-11 word i+4;
  // u[i + 4] likewise for rows 4-7 and 12-15.
  const __m512i words_low = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i words_high = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    out[i] = _mm512_permutex2var_epi64(u[i], words_low, u[i + 4]);
    out[i + 4] = _mm512_permutex2var_epi64(u[i], words_high, u[i + 4]);
  }
}

[[gnu::always_inline]] inline void store_scales(const PanelRows& rows, size_t block_offset, bool has_minimum,
                                                uint8_t* out) {
  const __m512i words = _mm512_i32gather_epi32(rows.offsets, rows.row[0] + block_offset, 1);
  _mm512_store_ps(out + kPanelWeightBytes, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)));
  if (has_minimum) {
    _mm512_store_ps(out + kPanelWeightBytes + 64,
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16))));
  }
}

[[gnu::always_inline]] inline void relay_q8_0(const PanelRows& rows, int64_t block, uint8_t* out) {
  const size_t offset = block * sizeof(BlockQ8_0);
  __m512i z[8], groups[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.row[j] + offset + 2));
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.row[j + 8] + offset + 2));
    z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
  transpose_rows_to_groups(z, groups);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) _mm512_store_si512(out + 64 * g, _mm512_xor_si512(groups[g], flip));
  store_scales(rows, offset, false, out);
}

// Q4_0 and Q4_1: byte i of a block holds values i (low nibble) and i + 16 (high nibble).
[[gnu::always_inline]] inline void relay_q4(const PanelRows& rows, int64_t block, size_t block_bytes,
                                            size_t nibbles_offset, bool has_minimum, uint8_t* out) {
  const size_t offset = block * block_bytes;
  const __m512i low_nibble = _mm512_set1_epi8(0x0f);
  __m512i low[4], high[4];
  // Vector q holds rows q, q+4, q+8, q+12 in its 128-bit lanes, so that the in-lane transpose below leaves
  // row 4L+i at word i of lane L, i.e. the rows in order.
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const auto lane = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows.row[r] + offset + nibbles_offset));
    };
    __m512i z = _mm512_castsi128_si512(lane(q));
    z = _mm512_inserti32x4(z, lane(q + 4), 1);
    z = _mm512_inserti32x4(z, lane(q + 8), 2);
    z = _mm512_inserti32x4(z, lane(q + 12), 3);
    low[q] = _mm512_and_si512(z, low_nibble);                         // word t: values 4t..4t+3
    high[q] = _mm512_and_si512(_mm512_srli_epi16(z, 4), low_nibble);  // word t: values 16+4t..
  }
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    const __m512i* v = half == 0 ? low : high;
    const __m512i a0 = _mm512_unpacklo_epi32(v[0], v[1]), a1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(v[2], v[3]), a3 = _mm512_unpackhi_epi32(v[2], v[3]);
    uint8_t* o = out + 256 * half;
    _mm512_store_si512(o, _mm512_unpacklo_epi64(a0, a2));
    _mm512_store_si512(o + 64, _mm512_unpackhi_epi64(a0, a2));
    _mm512_store_si512(o + 128, _mm512_unpacklo_epi64(a1, a3));
    _mm512_store_si512(o + 192, _mm512_unpackhi_epi64(a1, a3));
  }
  store_scales(rows, offset, has_minimum, out);
}

void relay_chunk(DType type, const PanelRows& rows, int64_t first_block, int n_blocks, uint8_t* out) {
  const bool has_minimum = type == DType::Q4_1;
  const size_t stride = panel_block_bytes(has_minimum);
  for (int b = 0; b < n_blocks; ++b, out += stride) {
    switch (type) {
      case DType::Q8_0:
        relay_q8_0(rows, first_block + b, out);
        break;
      case DType::Q4_0:
        relay_q4(rows, first_block + b, sizeof(BlockQ4_0), 2, false, out);
        break;
      default:
        relay_q4(rows, first_block + b, sizeof(BlockQ4_1), 4, true, out);
        break;
    }
  }
}

// ---- the quantised micro-kernel -----------------------------------------------------------------------

/// One chunk of R panels (16R weight rows) times C activation rows.
struct ChunkTile {
  const uint8_t* panels;  // R re-laid panel chunks, panel_stride bytes apart
  size_t panel_stride;
  int n_blocks;            // blocks in this chunk
  const int8_t* x_values;  // activation row 0 of the tile at the chunk's first block
  const ActivationBlock* x_blocks;
  int64_t x_row_values;   // n_in
  int64_t x_row_blocks;   // n_in / 32
  float* y;               // output row 0 of the tile at the panels' first weight row
  int64_t y_row_stride;   // n_out
  __mmask16 row_mask[2];  // valid rows of each panel
  bool first_chunk;       // start from zero instead of the partial sums in y
};

template <int R, int C, bool kMinimum>
void chunk_kernel(const ChunkTile& t) {
  const size_t block_bytes = panel_block_bytes(kMinimum);
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      acc[r][c] = t.first_chunk
                      ? _mm512_setzero_ps()
                      : _mm512_maskz_loadu_ps(t.row_mask[r], t.y + c * t.y_row_stride + kPanelRows * r);
    }
  }
  // With few independent sums, split each block's 8 groups over two chains to hide vpdpbusd latency.
  constexpr int kChains = R * C <= 4 ? 2 : 1;
  for (int b = 0; b < t.n_blocks; ++b) {
    const uint8_t* panel_block = t.panels + b * block_bytes;
    __m512i sums[kChains][R][C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512i start = _mm512_set1_epi32(t.x_blocks[c * t.x_row_blocks + b].correction);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        sums[0][r][c] = start;
        if constexpr (kChains == 2) sums[kChains - 1][r][c] = _mm512_setzero_si512();
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      __m512i weights[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        weights[r] = _mm512_load_si512(panel_block + r * t.panel_stride + 64 * g);
      }
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        int32_t group;
        std::memcpy(&group, t.x_values + c * t.x_row_values + b * kQuantBlock + 4 * g, 4);
        const __m512i x = _mm512_set1_epi32(group);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          sums[g % kChains][r][c] = _mm512_dpbusd_epi32(sums[g % kChains][r][c], weights[r], x);
        }
      }
    }
    __m512 scales[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      scales[r] = _mm512_load_ps(panel_block + r * t.panel_stride + kPanelWeightBytes);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const ActivationBlock& xb = t.x_blocks[c * t.x_row_blocks + b];
      const __m512 x_scale = _mm512_set1_ps(xb.scale);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        __m512i sum = sums[0][r][c];
        if constexpr (kChains == 2) sum = _mm512_add_epi32(sum, sums[1][r][c]);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scales[r], x_scale), acc[r][c]);
      }
      if constexpr (kMinimum) {
        const __m512 x_sum = _mm512_set1_ps(xb.scaled_sum);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512 minimum = _mm512_load_ps(panel_block + r * t.panel_stride + kPanelWeightBytes + 64);
          acc[r][c] = _mm512_fmadd_ps(minimum, x_sum, acc[r][c]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      _mm512_mask_storeu_ps(t.y + c * t.y_row_stride + kPanelRows * r, t.row_mask[r], acc[r][c]);
    }
  }
}

using ChunkKernel = void (*)(const ChunkTile&);

template <bool kMinimum>
ChunkKernel pick_chunk_kernel(int r, int c) {
  static constexpr ChunkKernel table[2][4] = {
      {chunk_kernel<1, 1, kMinimum>, chunk_kernel<1, 2, kMinimum>, chunk_kernel<1, 3, kMinimum>,
       chunk_kernel<1, 4, kMinimum>},
      {chunk_kernel<2, 1, kMinimum>, chunk_kernel<2, 2, kMinimum>, chunk_kernel<2, 3, kMinimum>,
       chunk_kernel<2, 4, kMinimum>},
  };
  return table[r - 1][c - 1];
}

int32_t correction_per_sum(DType type) {
  switch (type) {
    case DType::Q8_0:
      return -128;  // weights stored as w + 128
    case DType::Q4_0:
      return -8;  // weights stored as w + 8 (the raw nibble)
    default:
      return 0;  // Q4_1 nibbles are the true values
  }
}

/// Software prefetch of the weight rows a thread needs next. A panel group's rows are read as 16 or 32
/// interleaved streams, which the hardware prefetchers follow poorly; the next group's rows are one
/// contiguous range, so it is fetched a slice per chunk (measured: decode from DRAM goes from ~8 to
/// ~16 GB/s per core).
class NextRowsPrefetch {
 public:
  NextRowsPrefetch(const Weight& w, int64_t first_row, int64_t end_row, int64_t n_chunks)
      : begin_(static_cast<const char*>(w.data) + first_row * w.row_stride),
        bytes_(static_cast<size_t>(std::max<int64_t>(end_row - first_row, 0)) * w.row_stride),
        slice_bytes_((bytes_ / static_cast<size_t>(n_chunks) + 63) / 64 * 64) {}

  // Always inlined: GCC treats prefetches as free of side effects, so it would deduce that an out-of-line
  // call does nothing and delete it.
  [[gnu::always_inline]] void fetch_slice(int64_t chunk) const {
    const size_t first = static_cast<size_t>(chunk) * slice_bytes_;
    for (size_t offset = first; offset < std::min(bytes_, first + slice_bytes_); offset += 64) {
      _mm_prefetch(begin_ + offset, _MM_HINT_T0);
    }
  }

 private:
  const char* begin_;
  size_t bytes_, slice_bytes_;
};

/// A thread's share of the products: panels [panels.begin, panels.end) against all n activation rows.
void multiply_panels(const Weight& w, WorkRange panels, const int8_t* x_values,
                     const ActivationBlock* x_blocks, int n, float* y, uint8_t* buffer, int max_panels) {
  const int64_t n_in = w.n_in, n_blocks = n_in / kQuantBlock, n_out = w.n_out;
  const bool has_minimum = w.type == DType::Q4_1;
  const size_t panel_stride = kChunkBlocks * panel_block_bytes(has_minimum);
  const int64_t n_chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
  constexpr int kMaxColumns = 4;
  for (int64_t p0 = panels.begin; p0 < panels.end; p0 += max_panels) {
    const int group = static_cast<int>(std::min<int64_t>(max_panels, panels.end - p0));
    ChunkTile tile{};
    tile.panels = buffer;
    tile.panel_stride = panel_stride;
    tile.x_row_values = n_in;
    tile.x_row_blocks = n_blocks;
    tile.y_row_stride = n_out;
    PanelRows rows[2];
    for (int p = 0; p < group; ++p) {
      const int64_t first_row = (p0 + p) * kPanelRows;
      rows[p] = panel_rows(w, first_row);
      tile.row_mask[p] = static_cast<__mmask16>((1u << std::min<int64_t>(kPanelRows, n_out - first_row)) - 1);
    }
    // Past the end of this thread's range too: the pool hands a thread the pieces of its share in order,
    // so the rows after its range are usually its next ones.
    const NextRowsPrefetch prefetch(w, std::min(n_out, (p0 + group) * kPanelRows),
                                    std::min(n_out, (p0 + 2 * group) * kPanelRows), n_chunks);
    for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      const int64_t k0 = chunk * kChunkBlocks;
      tile.n_blocks = static_cast<int>(std::min<int64_t>(kChunkBlocks, n_blocks - k0));
      tile.first_chunk = chunk == 0;
      prefetch.fetch_slice(chunk);
      for (int p = 0; p < group; ++p)
        relay_chunk(w.type, rows[p], k0, tile.n_blocks, buffer + p * panel_stride);
      for (int c0 = 0; c0 < n; c0 += kMaxColumns) {
        const int columns = std::min(kMaxColumns, n - c0);
        tile.x_values = x_values + c0 * n_in + k0 * kQuantBlock;
        tile.x_blocks = x_blocks + c0 * n_blocks + k0;
        tile.y = y + c0 * n_out + p0 * kPanelRows;
        (has_minimum ? pick_chunk_kernel<true>(group, columns)
                     : pick_chunk_kernel<false>(group, columns))(tile);
      }
    }
  }
}

void matmul_quantized(const Weight& w, const float* x, int n, float* y) {
  const int64_t n_in = w.n_in, n_blocks = n_in / kQuantBlock;
  std::byte* memory = thread_scratch(ScratchSlot::Activations)
                          .reserve(static_cast<size_t>(n) * (n_in + n_blocks * sizeof(ActivationBlock)));
  auto* x_blocks = reinterpret_cast<ActivationBlock*>(memory);
  auto* x_values = reinterpret_cast<int8_t*>(x_blocks + n * n_blocks);
  // Decode (a few activation rows) is bound by memory bandwidth: one panel at a time keeps the number of
  // interleaved row streams low. Prefill reuses each panel chunk across as many rows as registers allow.
  // The crossover, measured with `choreo bench --parallel` (BENCHMARKS.md): one panel is as fast or faster
  // up to 8 rows (SmolLM2 B=8: 739 vs 682 tok/s), two panels win from 16 (Llama-3.2-1B shape Q8_0 B=16:
  // 136 vs 129 tok/s).
  const int max_panels = n <= kOnePanelRows ? 1 : 2;
  const int64_t n_panels = (w.n_out + kPanelRows - 1) / kPanelRows;
  const auto quantize_rows = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      quantize_activation_row(x + c * n_in, n_in, correction_per_sum(w.type), x_values + c * n_in,
                              x_blocks + c * n_blocks);
    }
  };
  ThreadPool& pool = kernel_pool();
  // A few rows are quicker to quantise here than to share out at the cost of one more loop.
  if (n > 4) {
    pool.parallel_for(n, pool.grain_for(n, 1), quantize_rows);
  } else {
    quantize_rows(0, n);
  }
  pool.parallel_for(n_panels, matmul_grain(w, n_panels, kPanelRows, n), [&](int64_t begin, int64_t end) {
    auto* buffer = reinterpret_cast<uint8_t*>(
        thread_scratch(ScratchSlot::Panels).reserve(max_panels * kChunkBlocks * panel_block_bytes(true)));
    multiply_panels(w, {begin, end}, x_values, x_blocks, n, y, buffer, max_panels);
  });
}

// ---- float weights ----------------------------------------------------------------------------------

template <DType T>
__m512 load_weights(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::F32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (T == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
}

template <DType T>
__m512 load_weights_masked(const uint8_t* row, int64_t i, __mmask16 mask) {
  if constexpr (T == DType::F32) {
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + i);
  } else {
    const __m256i bits = _mm256_maskz_loadu_epi16(mask, row + 2 * i);
    if constexpr (T == DType::F16) return _mm512_cvtph_ps(bits);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
}

template <DType T, int R, int C>
void float_tile(const Weight& w, int64_t row, const float* x, int c0, float* y) {
  const uint8_t* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = static_cast<const uint8_t*>(w.data) + (row + r) * w.row_stride;
  const int64_t n_in = w.n_in;
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const auto step = [&](int64_t i, __mmask16 mask, bool full) {
    __m512 weights[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      weights[r] = full ? load_weights<T>(rows[r], i) : load_weights_masked<T>(rows[r], i, mask);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const float* xc = x + (c0 + c) * n_in + i;
      const __m512 xv = full ? _mm512_loadu_ps(xc) : _mm512_maskz_loadu_ps(mask, xc);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(weights[r], xv, acc[r][c]);
    }
  };
  int64_t i = 0;
  for (; i + 16 <= n_in; i += 16) step(i, 0xffff, true);
  if (i < n_in) step(i, static_cast<__mmask16>((1u << (n_in - i)) - 1), false);
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[(c0 + c) * w.n_out + row + r] = _mm512_reduce_add_ps(acc[r][c]);
  }
}

template <DType T>
void matmul_float_typed(const Weight& w, const float* x, int n, float* y) {
  const int64_t n_panels = (w.n_out + kPanelRows - 1) / kPanelRows;
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n_panels, matmul_grain(w, n_panels, kPanelRows, n), [&](int64_t begin, int64_t end) {
    const int64_t row_end = std::min(w.n_out, end * kPanelRows);
    for (int64_t row = begin * kPanelRows; row < row_end;) {
      const bool four = row + 4 <= row_end;
      int c = 0;
      for (; c + 4 <= n; c += 4)
        four ? float_tile<T, 4, 4>(w, row, x, c, y) : float_tile<T, 1, 4>(w, row, x, c, y);
      for (; c < n; ++c) four ? float_tile<T, 4, 1>(w, row, x, c, y) : float_tile<T, 1, 1>(w, row, x, c, y);
      row += four ? 4 : 1;
    }
  });
}

}  // namespace

void matmul_avx512(const Weight& w, const float* x, int n, float* y) {
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
