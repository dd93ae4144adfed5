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
#include <cassert>
#include <cstring>
#include <span>

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

/// 16-row panels of a weight (the last one partial when n_out is not a multiple of 16).
int64_t panel_count(const Weight& w) { return (w.n_out + kPanelRows - 1) / kPanelRows; }

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

/// The first 4 bytes of one block of each of the 16 rows: the fp16 scale in the low half, and for Q4_1 the
/// fp16 minimum in the high half.
[[gnu::always_inline]] inline __m512i block_heads(const PanelRows& rows, size_t block_offset) {
  return _mm512_i32gather_epi32(rows.offsets, rows.row[0] + block_offset, 1);
}

/// Q4 bytes (two values each) split into their low and high nibbles.
[[gnu::always_inline]] inline void split_nibbles(__m512i bytes, __m512i& low, __m512i& high) {
  const __m512i low_nibble = _mm512_set1_epi8(0x0f);
  low = _mm512_and_si512(bytes, low_nibble);
  high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibble);
}

[[gnu::always_inline]] inline void store_scales(const PanelRows& rows, size_t block_offset, bool has_minimum,
                                                uint8_t* out) {
  const __m512i words = block_heads(rows, block_offset);
  _mm512_store_ps(out + kPanelWeightBytes, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)));
  if (has_minimum) {
    _mm512_store_ps(out + kPanelWeightBytes + 64,
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16))));
  }
}

// Q8_0: out[g] holds values 4g..4g+3 of row r in its 32-bit word r, as unsigned bytes w + 128.
[[gnu::always_inline]] inline void q8_0_groups(const PanelRows& rows, int64_t block, __m512i out[8]) {
  const size_t offset = block * sizeof(BlockQ8_0);
  __m512i z[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.row[j] + offset + 2));
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.row[j + 8] + offset + 2));
    z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
  transpose_rows_to_groups(z, out);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) out[g] = _mm512_xor_si512(out[g], flip);
}

// Q4_0 and Q4_1: byte i of a block holds values i (low nibble) and i + 16 (high nibble). out[t] holds bytes
// 4t..4t+3 of row r's nibbles in its 32-bit word r: values 4t..4t+3 in the low nibbles, 16+4t.. in the high.
[[gnu::always_inline]] inline void q4_words(const PanelRows& rows, int64_t block, size_t block_bytes,
                                            size_t nibbles_offset, __m512i out[4]) {
  const size_t offset = block * block_bytes;
  __m512i z[4];
  // Vector q holds rows q, q+4, q+8, q+12 in its 128-bit lanes, so that the in-lane transpose below leaves
  // row 4L+i at word i of lane L, i.e. the rows in order.
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const auto lane = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows.row[r] + offset + nibbles_offset));
    };
    z[q] = _mm512_castsi128_si512(lane(q));
    z[q] = _mm512_inserti32x4(z[q], lane(q + 4), 1);
    z[q] = _mm512_inserti32x4(z[q], lane(q + 8), 2);
    z[q] = _mm512_inserti32x4(z[q], lane(q + 12), 3);
  }
  const __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i a2 = _mm512_unpacklo_epi32(z[2], z[3]), a3 = _mm512_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm512_unpacklo_epi64(a0, a2);
  out[1] = _mm512_unpackhi_epi64(a0, a2);
  out[2] = _mm512_unpacklo_epi64(a1, a3);
  out[3] = _mm512_unpackhi_epi64(a1, a3);
}

[[gnu::always_inline]] inline void relay_q8_0(const PanelRows& rows, int64_t block, uint8_t* out) {
  __m512i groups[8];
  q8_0_groups(rows, block, groups);
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) _mm512_store_si512(out + 64 * g, groups[g]);
  store_scales(rows, block * sizeof(BlockQ8_0), false, out);
}

[[gnu::always_inline]] inline void relay_q4(const PanelRows& rows, int64_t block, size_t block_bytes,
                                            size_t nibbles_offset, bool has_minimum, uint8_t* out) {
  __m512i words[4];
  q4_words(rows, block, block_bytes, nibbles_offset, words);
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    __m512i low, high;
    split_nibbles(words[t], low, high);
    _mm512_store_si512(out + 64 * t, low);
    _mm512_store_si512(out + 256 + 64 * t, high);
  }
  store_scales(rows, block * block_bytes, has_minimum, out);
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

// ---- packed weights ------------------------------------------------------------------------------------
//
// pack_weight_avx512 does the re-lay above once, at load, keeping the bytes' size: 16-row panels one after
// the other, each starting on a cache line (rows past the end of the matrix repeat the last row), and within a panel first every block's
// values, then every block's scales:
//   values, per block: Q8_0: 8 vectors, vector g holding values 4g..4g+3 of row r in its 32-bit word r, as
//     w + 128; Q4_0 and Q4_1: 4 vectors, vector t holding nibble bytes 4t..4t+3 of row r in its word r (values
//     4t..4t+3 in the low nibbles, 16+4t..16+4t+3 in the high), unpacked by the kernel with two instructions.
//   scales, per block: the 16 rows' fp16 scales, then for Q4_1 their 16 fp16 minimums.
// A thread's run of panels is then one contiguous range of memory, read once, front to back.

constexpr size_t packed_value_bytes(DType type) { return type == DType::Q8_0 ? 512 : 256; }
constexpr size_t packed_scale_bytes(DType type) { return type == DType::Q4_1 ? 64 : 32; }

// Panels start on a cache line: Q8_0 and Q4_0 panels of an odd number of blocks are padded to one.
size_t packed_panel_bytes(const Weight& w) {
  const size_t bytes =
      static_cast<size_t>(w.n_in / kQuantBlock) * (packed_value_bytes(w.type) + packed_scale_bytes(w.type));
  return (bytes + 63) / 64 * 64;
}

void pack_panel(const Weight& w, int64_t panel, uint8_t* out) {
  const PanelRows rows = panel_rows(w, panel * kPanelRows);
  const int64_t n_blocks = w.n_in / kQuantBlock;
  const size_t value_bytes = packed_value_bytes(w.type), scale_bytes = packed_scale_bytes(w.type);
  const size_t block_bytes = type_traits(w.type).block_bytes;
  uint8_t* scales = out + n_blocks * value_bytes;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* values = out + b * value_bytes;
    if (w.type == DType::Q8_0) {
      __m512i groups[8];
      q8_0_groups(rows, b, groups);
      for (int g = 0; g < 8; ++g) _mm512_store_si512(values + 64 * g, groups[g]);
    } else {
      __m512i words[4];
      q4_words(rows, b, block_bytes, w.type == DType::Q4_0 ? 2 : 4, words);
      for (int t = 0; t < 4; ++t) _mm512_store_si512(values + 64 * t, words[t]);
    }
    const __m512i words = block_heads(rows, b * block_bytes);
    uint8_t* block_scales = scales + b * scale_bytes;
    _mm256_store_si256(reinterpret_cast<__m256i*>(block_scales), _mm512_cvtepi32_epi16(words));
    if (w.type == DType::Q4_1) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(block_scales + 32),
                         _mm512_cvtepi32_epi16(_mm512_srli_epi32(words, 16)));
    }
  }
}

/// Where a packed panel's values and scales of one block on lie.
struct PackedBlocks {
  const uint8_t* values;
  const uint8_t* scales;
};

PackedBlocks packed_blocks(const Weight& w, int64_t panel, int64_t first_block) {
  const auto* start = static_cast<const uint8_t*>(w.packed.get()) + panel * packed_panel_bytes(w);
  const int64_t n_blocks = w.n_in / kQuantBlock;
  return {start + first_block * packed_value_bytes(w.type),
          start + n_blocks * packed_value_bytes(w.type) + first_block * packed_scale_bytes(w.type)};
}

// The re-lay of relay_chunk, from a packed panel (values and scales at the chunk's first block): the same
// buffer, bit for bit, with no gathers or transposes.
void relay_packed_chunk(DType type, const uint8_t* values, const uint8_t* scales, int n_blocks, uint8_t* out) {
  const bool has_minimum = type == DType::Q4_1;
  const size_t stride = panel_block_bytes(has_minimum);
  const size_t value_bytes = packed_value_bytes(type), scale_bytes = packed_scale_bytes(type);
  for (int b = 0; b < n_blocks; ++b, out += stride, values += value_bytes, scales += scale_bytes) {
    if (type == DType::Q8_0) {
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) _mm512_store_si512(out + 64 * g, _mm512_load_si512(values + 64 * g));
    } else {
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        __m512i low, high;
        split_nibbles(_mm512_load_si512(values + 64 * t), low, high);
        _mm512_store_si512(out + 64 * t, low);
        _mm512_store_si512(out + 256 + 64 * t, high);
      }
    }
    _mm512_store_ps(out + kPanelWeightBytes,
                    _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales))));
    if (has_minimum) {
      _mm512_store_ps(out + kPanelWeightBytes + 64,
                      _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales + 32))));
    }
  }
}

// ---- the quantised micro-kernel -----------------------------------------------------------------------

/// R panels (16R weight rows), from one block on, times C activation rows: what both micro-kernels read.
struct Tile {
  const uint8_t* values;  // panel 0's weights at the tile's first block; panel r is r * panel_stride further
  const uint8_t* scales;  // packed panels only: panel 0's scales at the tile's first block
  size_t panel_stride;
  int n_blocks;            // blocks in this tile
  const int8_t* x_values;  // activation row 0 of the tile at the tile's first block
  const ActivationBlock* x_blocks;
  int64_t x_row_values;   // n_in
  int64_t x_row_blocks;   // n_in / 32
  float* y;               // output row 0 of the tile at the panels' first weight row
  int64_t y_row_stride;   // n_out
  __mmask16 row_mask[2];  // valid rows of each panel
  bool first;             // start from zero instead of the partial sums in y
};

// The steps both micro-kernels share, so that they perform the same fp32 operations in the same order.

template <int R, int C>
[[gnu::always_inline]] inline void load_accumulators(const Tile& t, __m512 acc[R][C]) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      acc[r][c] = t.first ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(t.row_mask[r], t.y + c * t.y_row_stride + kPanelRows * r);
    }
  }
}

template <int R, int C>
[[gnu::always_inline]] inline void store_accumulators(const Tile& t, const __m512 acc[R][C]) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      _mm512_mask_storeu_ps(t.y + c * t.y_row_stride + kPanelRows * r, t.row_mask[r], acc[r][c]);
    }
  }
}

/// Each block's integer sums start at the activation's correction (chain 0) and zero (chain 1).
template <int R, int C, int kChains>
[[gnu::always_inline]] inline void start_sums(const Tile& t, int b, __m512i sums[kChains][R][C]) {
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    const __m512i start = _mm512_set1_epi32(t.x_blocks[c * t.x_row_blocks + b].correction);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      sums[0][r][c] = start;
      if constexpr (kChains == 2) sums[kChains - 1][r][c] = _mm512_setzero_si512();
    }
  }
}

/// Activation group g (4 values) of tile row c at block b, broadcast.
[[gnu::always_inline]] inline __m512i activation_group(const Tile& t, int c, int b, int g) {
  int32_t group;
  std::memcpy(&group, t.x_values + c * t.x_row_values + b * kQuantBlock + 4 * g, 4);
  return _mm512_set1_epi32(group);
}

/// The integer sums of one block whose weights are 8 vectors of unsigned bytes (the panel layout), group g
/// into chain g % kChains.
template <int R, int C, int kChains>
[[gnu::always_inline]] inline void multiply_byte_groups(const Tile& t, int b, const uint8_t* block,
                                                        __m512i sums[kChains][R][C]) {
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    __m512i weights[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) weights[r] = _mm512_load_si512(block + r * t.panel_stride + 64 * g);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512i x = activation_group(t, c, b, g);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        sums[g % kChains][r][c] = _mm512_dpbusd_epi32(sums[g % kChains][r][c], weights[r], x);
      }
    }
  }
}

/// acc = fma(float(sum), weight scale * activation scale, acc), then for Q4_1 acc = fma(minimum, scaled sum, acc).
template <int R, int C, int kChains, bool kMinimum>
[[gnu::always_inline]] inline void finish_block(const Tile& t, int b, const __m512i sums[kChains][R][C],
                                                const __m512 scales[R], const __m512 minimums[R],
                                                __m512 acc[R][C]) {
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
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(minimums[r], x_sum, acc[r][c]);
    }
  }
}

/// One chunk of R re-laid panels times C activation rows.
template <int R, int C, bool kMinimum>
void chunk_kernel(const Tile& t) {
  const size_t block_bytes = panel_block_bytes(kMinimum);
  __m512 acc[R][C];
  load_accumulators<R, C>(t, acc);
  // With few independent sums, split each block's 8 groups over two chains to hide vpdpbusd latency.
  constexpr int kChains = R * C <= 4 ? 2 : 1;
  for (int b = 0; b < t.n_blocks; ++b) {
    const uint8_t* panel_block = t.values + b * block_bytes;
    __m512i sums[kChains][R][C];
    start_sums<R, C, kChains>(t, b, sums);
    multiply_byte_groups<R, C, kChains>(t, b, panel_block, sums);
    __m512 scales[R], minimums[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      scales[r] = _mm512_load_ps(panel_block + r * t.panel_stride + kPanelWeightBytes);
      if constexpr (kMinimum) minimums[r] = _mm512_load_ps(panel_block + r * t.panel_stride + kPanelWeightBytes + 64);
    }
    finish_block<R, C, kChains, kMinimum>(t, b, sums, scales, minimums, acc);
  }
  store_accumulators<R, C>(t, acc);
}

using ChunkKernel = void (*)(const Tile&);

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
  NextRowsPrefetch(const void* begin, size_t bytes, int64_t n_chunks)
      : begin_(static_cast<const char*>(begin)),
        bytes_(bytes),
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

/// A thread's share of the products: panels [panels.begin, panels.end) against all n activation rows, re-laid
/// chunk by chunk from the packed copy when the weight has one, else from its rows.
void multiply_panels(const Weight& w, WorkRange panels, const int8_t* x_values,
                     const ActivationBlock* x_blocks, int n, float* y, uint8_t* buffer, int max_panels) {
  const bool packed = w.packed != nullptr;
  const int64_t n_in = w.n_in, n_blocks = n_in / kQuantBlock, n_out = w.n_out;
  const bool has_minimum = w.type == DType::Q4_1;
  const size_t panel_stride = kChunkBlocks * panel_block_bytes(has_minimum);
  const int64_t n_chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
  constexpr int kMaxColumns = 4;
  for (int64_t p0 = panels.begin; p0 < panels.end; p0 += max_panels) {
    const int group = static_cast<int>(std::min<int64_t>(max_panels, panels.end - p0));
    Tile tile{};
    tile.values = buffer;
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
    const int64_t next_row = std::min(n_out, (p0 + group) * kPanelRows);
    const NextRowsPrefetch prefetch =
        packed ? NextRowsPrefetch(packed_blocks(w, p0 + group, 0).values,
                                  std::clamp<int64_t>(panel_count(w) - p0 - group, 0, group) * packed_panel_bytes(w),
                                  n_chunks)
               : NextRowsPrefetch(static_cast<const uint8_t*>(w.data) + next_row * w.row_stride,
                                  (std::min(n_out, (p0 + 2 * group) * kPanelRows) - next_row) * w.row_stride,
                                  n_chunks);
    for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      const int64_t k0 = chunk * kChunkBlocks;
      tile.n_blocks = static_cast<int>(std::min<int64_t>(kChunkBlocks, n_blocks - k0));
      tile.first = chunk == 0;
      prefetch.fetch_slice(chunk);
      for (int p = 0; p < group; ++p) {
        if (packed) {
          const PackedBlocks blocks = packed_blocks(w, p0 + p, k0);
          relay_packed_chunk(w.type, blocks.values, blocks.scales, tile.n_blocks, buffer + p * panel_stride);
        } else {
          relay_chunk(w.type, rows[p], k0, tile.n_blocks, buffer + p * panel_stride);
        }
      }
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

constexpr size_t kPackedPrefetchBytes = 4096;

/// R packed panels times C activation rows, read where they are (decode).
template <DType T, int R, int C>
void packed_kernel(const Tile& t) {
  constexpr bool kMinimum = T == DType::Q4_1;
  constexpr size_t kValueBytes = packed_value_bytes(T), kScaleBytes = packed_scale_bytes(T);
  __m512 acc[R][C];
  load_accumulators<R, C>(t, acc);
  constexpr int kChains = R * C <= 4 ? 2 : 1;
  for (int b = 0; b < t.n_blocks; ++b) {
    const uint8_t* block_values = t.values + b * kValueBytes;
    // The hardware prefetchers alone leave decode at ~75% of the machine's read bandwidth (on the 1B shape,
    // Q4_0); fetching the values kPackedPrefetchBytes ahead brings it to ~95% (bench_matmul; 2-6 KiB measured
    // alike, 1 KiB or 8 KiB less).
#pragma GCC unroll 8
    for (size_t line = 0; line < kValueBytes; line += 64) {
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(block_values + r * t.panel_stride + line) + kPackedPrefetchBytes,
                     _MM_HINT_T0);
      }
    }
    __m512i sums[kChains][R][C];
    start_sums<R, C, kChains>(t, b, sums);
    if constexpr (T == DType::Q8_0) {
      multiply_byte_groups<R, C, kChains>(t, b, block_values, sums);
    } else {
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        __m512i low[R], high[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          split_nibbles(_mm512_load_si512(block_values + r * t.panel_stride + 64 * g), low[r], high[r]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const __m512i x_low = activation_group(t, c, b, g), x_high = activation_group(t, c, b, g + 4);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            sums[0][r][c] = _mm512_dpbusd_epi32(sums[0][r][c], low[r], x_low);
            sums[kChains - 1][r][c] = _mm512_dpbusd_epi32(sums[kChains - 1][r][c], high[r], x_high);
          }
        }
      }
    }
    __m512 scales[R], minimums[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const auto* block_scales = reinterpret_cast<const __m256i*>(t.scales + r * t.panel_stride + b * kScaleBytes);
      scales[r] = _mm512_cvtph_ps(_mm256_load_si256(block_scales));
      if constexpr (kMinimum) minimums[r] = _mm512_cvtph_ps(_mm256_load_si256(block_scales + 1));
    }
    finish_block<R, C, kChains, kMinimum>(t, b, sums, scales, minimums, acc);
  }
  store_accumulators<R, C>(t, acc);
}

using PackedKernel = void (*)(const Tile&);

// One panel at a time: packed weights are read as they are only for a few activation rows.
template <DType T>
PackedKernel pick_packed_kernel_typed(int c) {
  static constexpr PackedKernel table[4] = {packed_kernel<T, 1, 1>, packed_kernel<T, 1, 2>, packed_kernel<T, 1, 3>,
                                            packed_kernel<T, 1, 4>};
  return table[c - 1];
}

PackedKernel pick_packed_kernel(DType type, int c) {
  switch (type) {
    case DType::Q8_0:
      return pick_packed_kernel_typed<DType::Q8_0>(c);
    case DType::Q4_0:
      return pick_packed_kernel_typed<DType::Q4_0>(c);
    default:
      return pick_packed_kernel_typed<DType::Q4_1>(c);
  }
}

/// multiply_panels for a packed weight and up to kOnePanelRows activation rows, one panel at a time. Up to 4
/// rows (one register tile), a panel is read in one pass; more take it kChunkBlocks blocks at a time, so that
/// each piece is reused from L1.
void multiply_packed_panels(const Weight& w, WorkRange panels, const int8_t* x_values,
                            const ActivationBlock* x_blocks, int n, float* y) {
  const int64_t n_in = w.n_in, n_blocks = n_in / kQuantBlock, n_out = w.n_out;
  constexpr int kMaxColumns = 4;
  const int64_t tile_blocks = n <= kMaxColumns ? n_blocks : kChunkBlocks;
  Tile tile{};
  tile.panel_stride = packed_panel_bytes(w);
  tile.x_row_values = n_in;
  tile.x_row_blocks = n_blocks;
  tile.y_row_stride = n_out;
  for (int64_t p = panels.begin; p < panels.end; ++p) {
    tile.row_mask[0] = static_cast<__mmask16>((1u << std::min<int64_t>(kPanelRows, n_out - p * kPanelRows)) - 1);
    for (int64_t k0 = 0; k0 < n_blocks; k0 += tile_blocks) {
      const PackedBlocks blocks = packed_blocks(w, p, k0);
      tile.values = blocks.values;
      tile.scales = blocks.scales;
      tile.n_blocks = static_cast<int>(std::min<int64_t>(tile_blocks, n_blocks - k0));
      tile.first = k0 == 0;
      for (int c0 = 0; c0 < n; c0 += kMaxColumns) {
        tile.x_values = x_values + c0 * n_in + k0 * kQuantBlock;
        tile.x_blocks = x_blocks + c0 * n_blocks + k0;
        tile.y = y + c0 * n_out + p * kPanelRows;
        pick_packed_kernel(w.type, std::min(kMaxColumns, n - c0))(tile);
      }
    }
  }
}

/// The products of one input with several quantised weights of one type and row length (a single weight,
/// or a layer's q, k and v): the input is quantised once, and one loop runs over every weight's panels, so
/// the threads meet once for the whole group instead of once per weight.
void matmul_quantized(std::span<const MatmulOutput> outputs, const float* x, int n) {
  const Weight& w0 = *outputs.front().w;
  const int64_t n_in = w0.n_in, n_blocks = n_in / kQuantBlock;
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
  // Panel p of the group is panel p - first[j] of weight j, for first[j] <= p < first[j + 1].
  assert(outputs.size() <= kMaxGroupWeights);
  int64_t first[kMaxGroupWeights + 1] = {0};
  bool packed = true;
  for (size_t j = 0; j < outputs.size(); ++j) {
    first[j + 1] = first[j] + panel_count(*outputs[j].w);
    packed = packed && outputs[j].w->packed != nullptr;
  }
  const int64_t n_panels = first[outputs.size()];
  const auto quantize_rows = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      quantize_activation_row(x + c * n_in, n_in, correction_per_sum(w0.type), x_values + c * n_in,
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
  // Runs multiply(weight, its panels, its y) for each weight's part of the group's panels [begin, end).
  const auto for_each_weight = [&](int64_t begin, int64_t end, auto&& multiply) {
    for (size_t j = 0; j < outputs.size(); ++j) {
      const int64_t b = std::max(begin, first[j]), e = std::min(end, first[j + 1]);
      if (b < e) multiply(*outputs[j].w, WorkRange{b - first[j], e - first[j]}, outputs[j].y);
    }
  };
  // Decode reads the packed copy as it is; more rows re-lay it chunk by chunk into L1, where each chunk is
  // reused by every row (unpacking Q4 nibbles once per chunk instead of once per row tile).
  if (packed && n <= kOnePanelRows) {
    pool.parallel_for(n_panels, matmul_grain(w0, n_panels, kPanelRows, n), [&](int64_t begin, int64_t end) {
      for_each_weight(begin, end, [&](const Weight& w, WorkRange panels, float* y) {
        multiply_packed_panels(w, panels, x_values, x_blocks, n, y);
      });
    });
    return;
  }
  pool.parallel_for(n_panels, matmul_grain(w0, n_panels, kPanelRows, n), [&](int64_t begin, int64_t end) {
    auto* buffer = reinterpret_cast<uint8_t*>(
        thread_scratch(ScratchSlot::Panels).reserve(max_panels * kChunkBlocks * panel_block_bytes(true)));
    for_each_weight(begin, end, [&](const Weight& w, WorkRange panels, float* y) {
      multiply_panels(w, panels, x_values, x_blocks, n, y, buffer, max_panels);
    });
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
  const int64_t n_panels = panel_count(w);
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

size_t packed_bytes_avx512(const Weight& w) {
  return static_cast<size_t>(panel_count(w)) * packed_panel_bytes(w);
}

void pack_weight_avx512(const Weight& w, uint8_t* out) {
  const int64_t n_panels = panel_count(w);
  const size_t panel_bytes = packed_panel_bytes(w);
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n_panels, pool.grain_for(n_panels), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) pack_panel(w, p, out + p * panel_bytes);
  });
}

void matmul_avx512(const Weight& w, const float* x, int n, float* y) {
  switch (w.type) {
    case DType::F32:
      return matmul_float_typed<DType::F32>(w, x, n, y);
    case DType::F16:
      return matmul_float_typed<DType::F16>(w, x, n, y);
    case DType::BF16:
      return matmul_float_typed<DType::BF16>(w, x, n, y);
    default: {
      const MatmulOutput output{&w, y};
      return matmul_quantized({&output, 1}, x, n);
    }
  }
}

void matmul_group_avx512(std::span<const MatmulOutput> outputs, const float* x, int n) {
  matmul_quantized(outputs, x, n);
}

}  // namespace choreo::kernels::cpu
