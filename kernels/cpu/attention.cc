#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/pages.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

namespace choreo::kernels::cpu {

namespace {

#define CHOREO_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

constexpr int kMaxRowsPerTile = 16;   // query rows of one group handled together
constexpr int kMaxHeadDim = 256;

/// Batch invariance: a query row's result must not depend on what else is computed with it (other rows, other
/// calls of a batch, the thread count), so that a call gives bit-identical logits alone or in any batch. The
/// keys a row sees are therefore always reduced the same way: each segment's pages are cut into chunks of
/// kChunkPages pages counted from the segment's start; each chunk gets its own online softmax (m, l, acc)
/// from scratch, and the chunks are folded into the row's result in order by fold_chunk. Whether the chunks of
/// a row run on one thread one after the other or in parallel (flash-decoding, when there are too few tiles
/// to keep the threads busy) changes the schedule, never the arithmetic.
constexpr int kChunkPages = 8;

/// One unit of work: some query rows of a group, for the query heads that share one KV head, over the chunks
/// [chunk_begin, chunk_end) of the group's visible chunks (counted across its segments in order). A tile with
/// `partial` set covers one chunk and writes its unnormalised result (m, l, acc) there for the fold;
/// otherwise it folds its chunks itself and writes the output rows. No chunk before `chunk_begin` lies in a
/// segment before `segment_begin`, whose first chunk is `segment_chunk_base`: a tile of one chunk starts at
/// its own segment instead of counting through every segment before it (a call over thousands of one-token
/// parents, such as a PML schema's last module, has thousands of chunks).
struct Tile {
  const AttentionGroup* group;
  int row_begin, row_end;  // absolute query rows
  int kv_head;
  int chunk_begin = 0, chunk_end = std::numeric_limits<int>::max();
  float* partial = nullptr;
  size_t segment_begin = 0;
  int segment_chunk_base = 0;
};

/// Tokens of `seg` that rows [row_begin, row_end) of `g` can see (the farthest row decides).
int segment_visible_tokens(const AttentionGroup& g, const KvSegment& seg, int row_begin, int row_end) {
  const int row0 = row_begin - g.q_begin, n_rows = row_end - row_begin;
  return seg.causal_base >= 0 ? std::min(seg.n_tokens, seg.causal_base + row0 + n_rows) : seg.n_tokens;
}

/// Chunks of kChunkPages pages that `visible_tokens` tokens of a segment span.
int segment_chunks(int visible_tokens, int page_tokens) {
  const int pages = (visible_tokens + page_tokens - 1) / page_tokens;
  return (pages + kChunkPages - 1) / kChunkPages;
}

/// Folds one chunk's softmax state (m, l, acc) into a row's running state (M, L, ACC), in chunk order. The
/// only place chunks are combined, so every schedule computes the same numbers. A chunk in which the row saw
/// no key (l == 0) changes nothing; the first chunk that did is copied.
inline void fold_chunk(float& M, float& L, float* __restrict ACC, float m, float l, const float* __restrict acc,
                       int head_dim) {
  if (l == 0.0f) return;
  if (L == 0.0f) {
    M = m;
    L = l;
    std::copy(acc, acc + head_dim, ACC);
    return;
  }
  const float M2 = std::max(M, m);
  const float a = std::exp(M - M2), b = std::exp(m - M2);
  L = L * a + l * b;
  for (int d = 0; d < head_dim; ++d) ACC[d] = ACC[d] * a + acc[d] * b;
  M = M2;
}

constexpr int kLanes = 16;  // one AVX-512 register of floats; the fast paths work in blocks of this many

/// exp(x) for the softmax (x <= 0): Cephes-style range reduction and polynomial (relative error ~2e-7),
/// written so that the loop vectorises.
CHOREO_MULTIVERSION
void exp_inplace(float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) {
    float v = x[i] < -87.0f ? -87.0f : (x[i] > 0.0f ? 0.0f : x[i]);
    float k = __builtin_floorf(v * 1.44269504088896341f + 0.5f);
    k = k == k ? k : 0.0f;  // a NaN score (garbage weights) stays NaN through r and y, never converted to int
    float r = v - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = (int32_t(k) + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &bits, sizeof(scale));
    x[i] = y * scale;
  }
}

/// The softmax step of one page for nq score rows (ld floats apart), row i seeing its first limit[i] keys:
/// row_max[i] = max(m[i], those scores), the scores become exp(score - row_max[i]) and the rest of the row
/// zeros, and row_sum[i] is their sum added left to right. A row with limit[i] <= 0 becomes zeros.
void softmax_rows(float* s, int nq, int ld, const int* limit, const float* m, float* row_max, float* row_sum) {
  for (int i = 0; i < nq; ++i) {
    float* si = s + size_t(i) * ld;
    const int n = limit[i];
    if (n <= 0) {
      std::fill(si, si + ld, 0.0f);
      continue;
    }
    float mx = m[i];
    for (int j = 0; j < n; ++j) mx = std::max(mx, si[j]);
    for (int j = 0; j < n; ++j) si[j] -= mx;
    exp_inplace(si, n);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += si[j];
    std::fill(si + n, si + ld, 0.0f);
    row_max[i] = mx;
    row_sum[i] = sum;
  }
}

/// S[i][j] = scale * sum_d Q[i][d] * Kt[d][j] for nq query vectors against the keys of one page tile
/// (Kt: [head_dim][ld], ld = page_tokens). Columns past n_keys are computed from whatever the page holds
/// there and ignored by the caller.
CHOREO_MULTIVERSION
void scores_tile(const float* __restrict qs, int nq, const float* __restrict kt, int n_keys, int ld, int head_dim,
                 float scale, float* __restrict s) {
  if (ld % kLanes == 0) {
    for (int i = 0; i < nq; ++i) {
      const float* qi = qs + size_t(i) * head_dim;
      for (int j0 = 0; j0 < n_keys; j0 += kLanes) {
        float acc[kLanes] = {};
        for (int d = 0; d < head_dim; ++d) {
          const float qd = qi[d];
          const float* kd = kt + size_t(d) * ld + j0;
          for (int l = 0; l < kLanes; ++l) acc[l] += qd * kd[l];
        }
        for (int l = 0; l < kLanes; ++l) s[size_t(i) * ld + j0 + l] = acc[l] * scale;
      }
    }
    return;
  }
  for (int i = 0; i < nq; ++i) {
    const float* qi = qs + size_t(i) * head_dim;
    for (int j = 0; j < n_keys; ++j) {
      float acc = 0.0f;
      for (int d = 0; d < head_dim; ++d) acc += qi[d] * kt[size_t(d) * ld + j];
      s[size_t(i) * ld + j] = acc * scale;
    }
  }
}

/// acc[i] = acc[i] * corr[i] + sum_j P[i][j] V[j] for nq rows; V rows are strided by v_stride floats.
CHOREO_MULTIVERSION
void accumulate_tile(float* __restrict acc, const float* __restrict corr, const float* __restrict p, int nq, int ld,
                     const float* __restrict v, size_t v_stride, int n_keys, int head_dim) {
  if (head_dim % kLanes == 0) {
    for (int i = 0; i < nq; ++i) {
      float* ai = acc + size_t(i) * head_dim;
      const float* pi = p + size_t(i) * ld;
      for (int d0 = 0; d0 < head_dim; d0 += kLanes) {
        float a[kLanes];
        for (int l = 0; l < kLanes; ++l) a[l] = ai[d0 + l] * corr[i];
        for (int j = 0; j < n_keys; ++j) {
          const float w = pi[j];
          const float* vj = v + size_t(j) * v_stride + d0;
          for (int l = 0; l < kLanes; ++l) a[l] += w * vj[l];
        }
        for (int l = 0; l < kLanes; ++l) ai[d0 + l] = a[l];
      }
    }
    return;
  }
  for (int i = 0; i < nq; ++i) {
    float* ai = acc + size_t(i) * head_dim;
    for (int d = 0; d < head_dim; ++d) ai[d] *= corr[i];
    const float* pi = p + size_t(i) * ld;
    for (int j = 0; j < n_keys; ++j) {
      const float w = pi[j];
      const float* vj = v + size_t(j) * v_stride;
      for (int d = 0; d < head_dim; ++d) ai[d] += w * vj[d];
    }
  }
}

/// One head's row of a page in a cache type, as floats: exactly dequantize_row's values (half-to-float is
/// exact, and q8_0 is int8 times the block's fp16 scale), through a table of all 65536 halves.
const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < t.size(); ++h) t[h] = fp16_to_fp32(uint16_t(h));
    return t;
  }();
  return table.data();
}

void f16_row(const std::byte* src, float* __restrict dst, int n) {
  const float* table = half_table();
  for (int i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * size_t(i), sizeof(h));
    dst[i] = table[h];
  }
}

CHOREO_MULTIVERSION
void q8_0_row(const std::byte* src, float* __restrict dst, int n) {
  const float* table = half_table();
  for (int b = 0; b < n / kQuantBlock; ++b) {
    BlockQ8_0 block;
    std::memcpy(&block, src + size_t(b) * sizeof(BlockQ8_0), sizeof(block));
    const float scale = table[block.d];
    for (int i = 0; i < kQuantBlock; ++i) dst[b * kQuantBlock + i] = float(block.qs[i]) * scale;
  }
}

void decode_row(DType type, const std::byte* src, float* dst, int n) {
  if (type == DType::F16)
    f16_row(src, dst, n);
  else
    q8_0_row(src, dst, n);
}

/// Per-thread working memory of run_tile (grown once, reused: the hot loop allocates nothing).
struct TileScratch {
  std::vector<float> q_base, q_rot, acc, s, m, l, corr, row_max, row_sum, total_acc, total_m, total_l, k_tile, v_rows;
  std::vector<int> limit;
};

/// The keys ([head_dim][page_tokens] tile) and values (rows of v_stride floats) of one KV head in one layer
/// of a page, as f32. f32 pages are read in place; f16 and q8_0 pages are decoded into the scratch buffers
/// (the first n_keys tokens; later key columns are zero).
struct PageView {
  const float* kt;
  const float* v;
  size_t v_stride;
};

PageView view_page(const std::byte* page, const KvLayout& kv, int layer, int kv_head, int n_keys,
                   TileScratch& scratch, bool avx512) {
  const int head_dim = kv.head_dim;
  PageView view;
  if (kv.k_type == DType::F32) {
    view.kt = reinterpret_cast<const float*>(page) + kv.k_tile(layer, kv_head);
  } else {
    // Columns past n_keys are never used; they are zeroed only so that nothing uninitialised is read.
    scratch.k_tile.resize(size_t(head_dim) * kv.page_tokens);
    if (n_keys < kv.page_tokens) {
      for (int d = 0; d < head_dim; ++d)
        std::fill_n(scratch.k_tile.begin() + size_t(d) * kv.page_tokens + n_keys, kv.page_tokens - n_keys, 0.0f);
    }
    float row[kMaxHeadDim];
    const size_t head_offset = row_bytes(kv.k_type, int64_t(kv_head) * head_dim);
    const std::byte* rows = page + kv.layer_k(layer).offset + head_offset;
    if (avx512 && decode_key_tile_avx512(kv.k_type, rows, kv.k_row_bytes(), n_keys, head_dim, kv.page_tokens,
                                         scratch.k_tile.data())) {
      view.kt = scratch.k_tile.data();
    } else {
      for (int t = 0; t < n_keys; ++t) {
        decode_row(kv.k_type, rows + size_t(t) * kv.k_row_bytes(), row, head_dim);
        for (int d = 0; d < head_dim; ++d) scratch.k_tile[size_t(d) * kv.page_tokens + t] = row[d];
      }
      view.kt = scratch.k_tile.data();
    }
  }
  if (kv.v_type == DType::F32) {
    view.v = reinterpret_cast<const float*>(page + kv.layer_v(layer).offset) + size_t(kv_head) * head_dim;
    view.v_stride = size_t(kv.kv_dim());
  } else {
    scratch.v_rows.resize(size_t(head_dim) * kv.page_tokens);
    const size_t head_offset = row_bytes(kv.v_type, int64_t(kv_head) * head_dim);
    const std::byte* rows = page + kv.layer_v(layer).offset + head_offset;
    if (!avx512 || !decode_rows_avx512(kv.v_type, rows, kv.v_row_bytes(), n_keys, head_dim, scratch.v_rows.data(),
                                       size_t(head_dim))) {
      for (int t = 0; t < n_keys; ++t)
        decode_row(kv.v_type, rows + size_t(t) * kv.v_row_bytes(), scratch.v_rows.data() + size_t(t) * head_dim,
                   head_dim);
    }
    view.v = scratch.v_rows.data();
    view.v_stride = size_t(head_dim);
  }
  return view;
}

void run_tile(const Tile& tile, int layer, const float* q, int n_heads, const KvLayout& kv,
              const PageTable& page_table, const RopeParams& rope, float scale, float* out) {
  const int head_dim = kv.head_dim;
  const int heads_per_kv = n_heads / kv.n_kv_heads;
  const int n_rows = tile.row_end - tile.row_begin;
  const int nq = n_rows * heads_per_kv;  // query vectors in the tile, row-major then head
  const int ld = kv.page_tokens;
  const size_t q_stride = size_t(n_heads) * head_dim;

  const bool avx512 = simd_level() == SimdLevel::Avx512;
  thread_local TileScratch scratch;
  std::vector<float>& q_base = scratch.q_base;
  std::vector<float>& q_rot = scratch.q_rot;
  std::vector<float>& acc = scratch.acc;
  std::vector<float>& s = scratch.s;
  std::vector<float>& m = scratch.m;
  std::vector<float>& l = scratch.l;
  std::vector<float>& corr = scratch.corr;
  std::vector<float>& row_max = scratch.row_max;
  std::vector<float>& row_sum = scratch.row_sum;
  std::vector<int>& limit = scratch.limit;
  std::vector<float>& total_acc = scratch.total_acc;
  std::vector<float>& total_m = scratch.total_m;
  std::vector<float>& total_l = scratch.total_l;
  q_base.resize(size_t(nq) * head_dim);
  acc.resize(size_t(nq) * head_dim);
  s.resize(size_t(nq) * ld);
  m.resize(nq);
  l.resize(nq);
  corr.resize(nq);
  row_max.resize(nq);
  row_sum.resize(nq);
  limit.resize(nq);
  total_acc.assign(size_t(nq) * head_dim, 0.0f);
  total_m.assign(nq, -std::numeric_limits<float>::infinity());
  total_l.assign(nq, 0.0f);

  for (int r = 0; r < n_rows; ++r)
    for (int hh = 0; hh < heads_per_kv; ++hh) {
      int h = tile.kv_head * heads_per_kv + hh;
      const float* src = q + size_t(tile.row_begin + r) * q_stride + size_t(h) * head_dim;
      std::copy(src, src + head_dim, q_base.begin() + size_t(r * heads_per_kv + hh) * head_dim);
    }

  int chunk_index = tile.segment_chunk_base;  // position in the group's visible chunk sequence
  for (size_t segment = tile.segment_begin; segment < tile.group->segments.size(); ++segment) {
    const KvSegment& seg = tile.group->segments[segment];
    // The farthest any row of this tile can see in this segment.
    const int row0 = tile.row_begin - tile.group->q_begin;
    const int visible_max = segment_visible_tokens(*tile.group, seg, tile.row_begin, tile.row_end);
    const int seg_pages = (visible_max + kv.page_tokens - 1) / kv.page_tokens;
    const int seg_chunks = segment_chunks(visible_max, kv.page_tokens);
    const int first = std::max(0, tile.chunk_begin - chunk_index);
    const int last = std::min(seg_chunks, tile.chunk_end - chunk_index);
    chunk_index += seg_chunks;
    if (first >= last) continue;
    const float* qs = q_base.data();
    if (seg.delta != 0) {
      // Keys were rotated at their encoded positions; the segment sits `delta` later. Rotating the query by
      // -delta gives the same score as re-rotating every key by +delta.
      q_rot.assign(q_base.begin(), q_base.end());
      float cos_table[kMaxRopePairs], sin_table[kMaxRopePairs];
      rope_angles(-int64_t(seg.delta), rope, cos_table, sin_table);
      for (int i = 0; i < nq; ++i) rotate_head(q_rot.data() + size_t(i) * head_dim, cos_table, sin_table, rope);
      qs = q_rot.data();
    }
    for (int chunk = first; chunk < last; ++chunk) {
      // A fresh online softmax over the chunk's pages.
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      const int page_end = std::min(seg_pages, (chunk + 1) * kChunkPages);
      for (int t0 = chunk * kChunkPages * kv.page_tokens; t0 < page_end * kv.page_tokens; t0 += kv.page_tokens) {
        int n_keys = std::min(kv.page_tokens, visible_max - t0);
        const PageView page =
            view_page(page_table.get(seg.pages[t0 / kv.page_tokens]), kv, layer, tile.kv_head, n_keys, scratch, avx512);
        if (!avx512 || !scores_tile_avx512(qs, nq, page.kt, n_keys, ld, head_dim, scale, s.data()))
          scores_tile(qs, nq, page.kt, n_keys, ld, head_dim, scale, s.data());
        for (int i = 0; i < nq; ++i) {
          const int row = row0 + i / heads_per_kv;
          limit[i] = seg.causal_base >= 0 ? std::min(n_keys, seg.causal_base + row + 1 - t0) : n_keys;
        }
        if (!avx512 ||
            !softmax_rows_avx512(s.data(), nq, ld, limit.data(), m.data(), row_max.data(), row_sum.data()))
          softmax_rows(s.data(), nq, ld, limit.data(), m.data(), row_max.data(), row_sum.data());
        for (int i = 0; i < nq; ++i) {
          if (limit[i] <= 0) {
            corr[i] = 1.0f;
            continue;
          }
          const float c = std::exp(m[i] - row_max[i]);  // exp(-inf) = 0 on the chunk's first page
          l[i] = l[i] * c + row_sum[i];
          m[i] = row_max[i];
          corr[i] = c;
        }
        if (!avx512 || !accumulate_tile_avx512(acc.data(), corr.data(), s.data(), nq, ld, page.v, page.v_stride,
                                               n_keys, head_dim))
          accumulate_tile(acc.data(), corr.data(), s.data(), nq, ld, page.v, page.v_stride, n_keys, head_dim);
      }
      if (tile.partial) {  // one chunk: its state goes to the fold in attention()
        std::copy(m.begin(), m.begin() + nq, tile.partial);
        std::copy(l.begin(), l.begin() + nq, tile.partial + nq);
        std::copy(acc.begin(), acc.begin() + size_t(nq) * head_dim, tile.partial + 2 * nq);
        return;
      }
      for (int i = 0; i < nq; ++i)
        fold_chunk(total_m[i], total_l[i], total_acc.data() + size_t(i) * head_dim, m[i], l[i],
                   acc.data() + size_t(i) * head_dim, head_dim);
    }
  }
  if (tile.partial) {  // the chunk lies beyond every row's keys: an empty state
    std::fill(tile.partial, tile.partial + size_t(nq) * (head_dim + 2), 0.0f);
    return;
  }
  for (int r = 0; r < n_rows; ++r)
    for (int hh = 0; hh < heads_per_kv; ++hh) {
      int i = r * heads_per_kv + hh;
      int h = tile.kv_head * heads_per_kv + hh;
      float* dst = out + size_t(tile.row_begin + r) * q_stride + size_t(h) * head_dim;
      float inv = total_l[i] > 0.0f ? 1.0f / total_l[i] : 0.0f;
      for (int d = 0; d < head_dim; ++d) dst[d] = total_acc[size_t(i) * head_dim + d] * inv;
    }
}

}  // namespace

void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv, const PageTable& pages,
               std::span<const AttentionGroup> groups, const RopeParams& rope, float scale, float* out) {
  assert(kv.head_dim <= kMaxHeadDim);
  assert(n_heads % kv.n_kv_heads == 0);
  std::vector<Tile> tiles;
  for (const AttentionGroup& g : groups)
    for (int r = g.q_begin; r < g.q_end; r += kMaxRowsPerTile)
      for (int h = 0; h < kv.n_kv_heads; ++h) tiles.push_back({&g, r, std::min(g.q_end, r + kMaxRowsPerTile), h});

  ThreadPool& pool = kernel_pool();
  const int n_threads = pool.threads();
  if (n_threads == 1 || int(tiles.size()) >= 2 * n_threads) {
    pool.parallel_for(int64_t(tiles.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) run_tile(tiles[i], layer, q, n_heads, kv, pages, rope, scale, out);
    });
    return;
  }

  // Too few tiles to keep every thread busy (decode over a long context): each tile's chunks run in
  // parallel, one part per chunk, and are folded in chunk order below (flash-decoding). fold_chunk makes
  // the result the one the tile would have computed alone.
  const int heads_per_kv = n_heads / kv.n_kv_heads;
  const int head_dim = kv.head_dim;
  thread_local std::vector<float> partials;
  std::vector<Tile> parts;
  std::vector<std::pair<size_t, size_t>> parts_of(tiles.size());  // [first, end) in `parts`
  std::vector<size_t> offsets;
  size_t floats = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    const Tile& whole = tiles[t];
    const int nq = (whole.row_end - whole.row_begin) * heads_per_kv;
    parts_of[t].first = parts.size();
    // The visible chunks, counted as run_tile counts them.
    int chunk_base = 0;
    for (size_t segment = 0; segment < whole.group->segments.size(); ++segment) {
      const KvSegment& seg = whole.group->segments[segment];
      const int seg_chunks = segment_chunks(
          segment_visible_tokens(*whole.group, seg, whole.row_begin, whole.row_end), kv.page_tokens);
      for (int c = chunk_base; c < chunk_base + seg_chunks; ++c) {
        Tile part = whole;
        part.chunk_begin = c;
        part.chunk_end = c + 1;
        part.segment_begin = segment;
        part.segment_chunk_base = chunk_base;
        parts.push_back(part);
        offsets.push_back(floats);
        floats += size_t(nq) * (head_dim + 2);
      }
      chunk_base += seg_chunks;
    }
    parts_of[t].second = parts.size();
  }
  partials.resize(floats);
  for (size_t i = 0; i < parts.size(); ++i) parts[i].partial = partials.data() + offsets[i];
  pool.parallel_for(int64_t(parts.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) run_tile(parts[i], layer, q, n_heads, kv, pages, rope, scale, out);
  });

  const size_t q_stride = size_t(n_heads) * head_dim;
  float total_acc[kMaxHeadDim];
  for (size_t t = 0; t < tiles.size(); ++t) {
    const Tile& whole = tiles[t];
    const int nq = (whole.row_end - whole.row_begin) * heads_per_kv;
    for (int i = 0; i < nq; ++i) {
      float total_m = -std::numeric_limits<float>::infinity(), total_l = 0.0f;
      std::fill(total_acc, total_acc + head_dim, 0.0f);
      for (size_t p = parts_of[t].first; p < parts_of[t].second; ++p) {
        const float* part = parts[p].partial;
        fold_chunk(total_m, total_l, total_acc, part[i], part[nq + i], part + 2 * nq + size_t(i) * head_dim,
                   head_dim);
      }
      const int r = i / heads_per_kv, h = whole.kv_head * heads_per_kv + i % heads_per_kv;
      float* dst = out + size_t(whole.row_begin + r) * q_stride + size_t(h) * head_dim;
      const float inv = total_l > 0.0f ? 1.0f / total_l : 0.0f;
      for (int d = 0; d < head_dim; ++d) dst[d] = total_acc[d] * inv;
    }
  }
}

}  // namespace choreo::kernels::cpu
