#pragma once
// Segment attention as CUDA kernels (issue 14), written against kernels/cuda/portable.h: every query row of a
// group attends to the group's segments (cached runs of tokens in KV pages, each placed `delta` positions
// later, which the query sees by being rotated by -delta; a causal segment shows query j its first
// causal_base + j + 1 tokens), for one layer of a KV pool laid out as kernels::KvLayout, in f32, f16 or q8_0
// (keys and values decoded as KvLayout::read_k / read_v decode them).
//
// Split-K with a fixed-order reduction, so that a query's result never depends on the rest of its batch
// (batch invariance):
// - attention_partials: one warp (a block of 32 threads) per (query, head, split); a split is `split_tokens` consecutive keys of the
//   group's visible keys (segments in order). Lane t scores key t of each 32-key tile (its dot product over
//   the head dimension in order), the warp keeps an online softmax (running max m, sum l) and each lane
//   accumulates its own output dimensions. Writes (m, l, acc) per split.
// - attention_combine: one warp per (query, head): the splits in order, rescaled to their common max.
// A split with no visible key writes m = -inf, l = 0, acc = 0, which adds exact zeros: the number of splits
// a batch needs does not change any query's bits.

#include <cstdint>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/device.cuh"
#include "kernels/cuda/kernels/rope.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

inline constexpr int kMaxHeadDim = 256;

/// Keys of segment `seg` visible to query row j of its group.
CHOREO_DEVICE inline int visible_keys(const AttnSegment& seg, int j) {
  if (seg.causal_base < 0) return seg.n_tokens;
  const int n = seg.causal_base + j + 1;
  return n < seg.n_tokens ? n : seg.n_tokens;
}

/// Bytes of one token's K or V row of a layer in a cache type, and the distance between pages in the pool.
CHOREO_DEVICE inline size_t kv_row_bytes(KvType t, size_t kv_dim) {
  return t == KvType::F32 ? 4 * kv_dim : t == KvType::F16 ? 2 * kv_dim : kv_dim / 32 * size_t(block_bytes(BlockFormat::Q8_0));
}
CHOREO_DEVICE inline size_t page_stride_bytes(const AttnCache& c) {
  const size_t kv_dim = size_t(c.n_kv_heads) * size_t(c.head_dim);
  const size_t bytes = size_t(c.n_layers) * size_t(c.page_tokens) * (kv_row_bytes(c.k_type, kv_dim) + kv_row_bytes(c.v_type, kv_dim));
  return (bytes + 3) / 4 * 4;
}

/// The float index of f32 key element d of token `slot` in page `page` (K is [layer][kv_head][head_dim][slot]).
CHOREO_DEVICE inline size_t key_at(const AttnCache& c, size_t page_floats, int page, int kv_head, int d, int slot) {
  return size_t(page) * page_floats +
         (size_t(c.layer) * size_t(c.n_kv_heads) + size_t(kv_head)) * size_t(c.head_dim) * size_t(c.page_tokens) +
         size_t(d) * size_t(c.page_tokens) + size_t(slot);
}

/// The float index of f32 value element d (V is [layer][slot] rows of n_kv_heads * head_dim, after every K).
CHOREO_DEVICE inline size_t value_at(const AttnCache& c, size_t page_floats, int page, int kv_head, int d, int slot) {
  const size_t kv_dim = size_t(c.n_kv_heads) * size_t(c.head_dim);
  return size_t(page) * page_floats + size_t(c.n_layers) * size_t(c.page_tokens) * kv_dim +
         (size_t(c.layer) * size_t(c.page_tokens) + size_t(slot)) * kv_dim + size_t(kv_head) * size_t(c.head_dim) +
         size_t(d);
}

/// Byte offsets of the f16 / q8_0 K row and of the V row of token `slot` in page `page` (both token-major:
/// every layer's K rows, then every layer's V rows).
CHOREO_DEVICE inline size_t key_row(const AttnCache& c, int page, int slot) {
  const size_t kv_dim = size_t(c.n_kv_heads) * size_t(c.head_dim);
  return size_t(page) * page_stride_bytes(c) +
         (size_t(c.layer) * size_t(c.page_tokens) + size_t(slot)) * kv_row_bytes(c.k_type, kv_dim);
}
CHOREO_DEVICE inline size_t value_row(const AttnCache& c, int page, int slot) {
  const size_t kv_dim = size_t(c.n_kv_heads) * size_t(c.head_dim);
  return size_t(page) * page_stride_bytes(c) + size_t(c.n_layers) * size_t(c.page_tokens) * kv_row_bytes(c.k_type, kv_dim) +
         (size_t(c.layer) * size_t(c.page_tokens) + size_t(slot)) * kv_row_bytes(c.v_type, kv_dim);
}

/// Element i of a token-major row at byte `row`, as kernels::KvLayout::read_k / read_v decode it (an f32 row
/// read byte by byte: after q8_0 keys, f32 values need not be 4-byte aligned).
CHOREO_DEVICE inline float row_element(KvType t, cu::Ptr<const uint8_t> bytes, size_t row, int i) {
  if (t == KvType::F32) {
    const size_t at = row + 4 * size_t(i);
    return cu::bits_to_float(uint32_t(bytes[at]) | uint32_t(bytes[at + 1]) << 8 | uint32_t(bytes[at + 2]) << 16 |
                             uint32_t(bytes[at + 3]) << 24);
  }
  if (t == KvType::F16) return half_to_float(uint32_t(bytes[row + 2 * size_t(i)]) | uint32_t(bytes[row + 2 * size_t(i) + 1]) << 8);
  return block_element(bytes, BlockFormat::Q8_0, row + size_t(i / 32) * size_t(block_bytes(BlockFormat::Q8_0)), i % 32);
}

/// Key / value element d of KV head kv_head of token `slot` in page `page`, in the cache's type (the float
/// index of f32 values assumes f32 keys before them).
CHOREO_DEVICE inline float key_element(const AttnCache& c, cu::Ptr<const float> pool, cu::Ptr<const uint8_t> bytes,
                                       size_t page_floats, int page, int kv_head, int d, int slot) {
  if (c.k_type == KvType::F32) return pool[key_at(c, page_floats, page, kv_head, d, slot)];
  return row_element(c.k_type, bytes, key_row(c, page, slot), kv_head * c.head_dim + d);
}
CHOREO_DEVICE inline float value_element(const AttnCache& c, cu::Ptr<const float> pool, cu::Ptr<const uint8_t> bytes,
                                         size_t page_floats, int page, int kv_head, int d, int slot) {
  if (c.v_type == KvType::F32 && c.k_type == KvType::F32) return pool[value_at(c, page_floats, page, kv_head, d, slot)];
  return row_element(c.v_type, bytes, value_row(c, page, slot), kv_head * c.head_dim + d);
}

/// One 32-key tile of a warp's online softmax: lane t holds key t's score (`valid` false past the window).
/// Raises the running max m to the tile's, rescales the sum l and this lane's accumulators acc[0, per_lane) to
/// it, adds the tile's weights to l, and returns this lane's weight exp(score - m). attention_partials and
/// attention_partials_tiled share it, so both perform the same operations in the same order (their bits agree).
CHOREO_DEVICE inline float online_softmax_tile(float score, bool valid, float& m, float& l, float* acc, int per_lane) {
  const float neg_inf = -cu::bits_to_float(0x7f800000u);
  const float tile_max = cu::warp_max(score);
  const float m_new = tile_max > m ? tile_max : m;
  const float rescale = m == neg_inf ? 0.0f : expf(m - m_new);
  const float p = valid ? expf(score - m_new) : 0.0f;
  const float p_sum = cu::warp_sum(p);
  l = l * rescale + p_sum;
  for (int k = 0; k < per_lane; ++k) acc[k] *= rescale;
  m = m_new;
  return p;
}

CHOREO_GLOBAL void attention_partials(cu::Ptr<const float> q, int n_heads, cu::Ptr<const float> pool, AttnCache cache,
                                      cu::Ptr<const int32_t> page_list, cu::Ptr<const AttnSegment> segments,
                                      cu::Ptr<const AttnGroup> groups, cu::Ptr<const int32_t> group_of_query,
                                      RopeArgs rope, cu::Ptr<const float> factors, float scale, int split_tokens,
                                      int n_splits, cu::Ptr<float> part_m, cu::Ptr<float> part_l,
                                      cu::Ptr<float> part_acc) {
  CHOREO_SHARED_ARRAY(float, q_rot, kMaxHeadDim);
  const int row = int(cu::block_idx().x), h = int(cu::block_idx().y), split = int(cu::block_idx().z);
  const int lane = int(cu::lane_id()), hd = cache.head_dim;
  const int kv_head = h / (n_heads / cache.n_kv_heads);
  const size_t page_floats = page_stride_bytes(cache) / 4;
  const cu::Ptr<const uint8_t> pool_bytes = cu::as_bytes(pool);
  const AttnGroup g = groups[group_of_query[row]];
  const int j = row - g.q_begin;
  const int first = split * split_tokens, last = first + split_tokens;  // this split's keys [first, last)
  const float neg_inf = -cu::bits_to_float(0x7f800000u);
  const int per_lane = (hd + 31) / 32;  // output dimensions lane + 32 k of this lane
  float m = neg_inf, l = 0.0f;
  float acc[kMaxHeadDim / 32];
  for (int k = 0; k < per_lane; ++k) acc[k] = 0.0f;
  int base = 0;  // index of the segment's first key among the group's visible keys
  for (int s = 0; s < g.n_segments; ++s) {
    const AttnSegment seg = segments[g.first_segment + s];
    const int n = visible_keys(seg, j);
    const int lo = first > base ? first - base : 0, hi = (last - base) < n ? last - base : n;
    base += n;
    if (lo >= hi) continue;
    // The query of this head, rotated by -delta for this segment's placement (pairs spread over lanes).
    cu::sync_threads();
    const size_t q_row = (size_t(row) * size_t(n_heads) + size_t(h)) * size_t(hd);
    for (int d = lane; d < hd; d += 32) q_rot[d] = q[q_row + size_t(d)];
    cu::sync_threads();
    if (seg.delta != 0) {
      for (int i = lane; i < rope.n_dims / 2; i += 32) {
        const RopePair pr = rope_pair(rope, factors, i, -double(seg.delta), 1);
        const float x0 = q_rot[pr.a], x1 = q_rot[pr.b];
        q_rot[pr.a] = x0 * pr.c - x1 * pr.s;
        q_rot[pr.b] = x0 * pr.s + x1 * pr.c;
      }
      cu::sync_threads();
    }
    for (int tile = lo; tile < hi; tile += 32) {
      const int key = tile + lane;
      float score = neg_inf;
      int page = 0, slot = 0;
      if (key < hi) {
        page = page_list[seg.first_page + key / cache.page_tokens];
        slot = key % cache.page_tokens;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d)
          dot += q_rot[d] * key_element(cache, pool, pool_bytes, page_floats, page, kv_head, d, slot);
        score = dot * scale;
      }
      const float p = online_softmax_tile(score, key < hi, m, l, acc, per_lane);
      const int count = hi - tile < 32 ? hi - tile : 32;
      const cu::WarpValues<float> p_of = cu::warp_values(p);
      const cu::WarpValues<int> page_of = cu::warp_values(page), slot_of = cu::warp_values(slot);
      for (int t = 0; t < 32; ++t) {
        const float pt = p_of[t];
        const int page_t = page_of[t], slot_t = slot_of[t];
        if (t >= count) continue;
        for (int k = 0; k < per_lane && lane + 32 * k < hd; ++k)
          acc[k] += pt * value_element(cache, pool, pool_bytes, page_floats, page_t, kv_head, lane + 32 * k, slot_t);
      }
    }
  }
  const size_t at = (size_t(row) * size_t(n_heads) + size_t(h)) * size_t(n_splits) + size_t(split);
  if (lane == 0) {
    part_m[at] = m;
    part_l[at] = l;
  }
  for (int k = 0; k < per_lane && lane + 32 * k < hd; ++k) part_acc[at * size_t(hd) + size_t(lane + 32 * k)] = acc[k];
}

CHOREO_GLOBAL void attention_combine(int n_heads, int head_dim, int n_splits, cu::Ptr<const float> part_m,
                                     cu::Ptr<const float> part_l, cu::Ptr<const float> part_acc, cu::Ptr<float> out) {
  const int row = int(cu::block_idx().x), h = int(cu::block_idx().y), lane = int(cu::lane_id());
  const size_t first = (size_t(row) * size_t(n_heads) + size_t(h)) * size_t(n_splits);
  const float neg_inf = -cu::bits_to_float(0x7f800000u);
  float m = neg_inf;
  for (int s = 0; s < n_splits; ++s) m = part_m[first + size_t(s)] > m ? part_m[first + size_t(s)] : m;
  float l = 0.0f;
  for (int s = 0; s < n_splits; ++s)
    if (part_m[first + size_t(s)] != neg_inf) l += part_l[first + size_t(s)] * expf(part_m[first + size_t(s)] - m);
  const size_t o = (size_t(row) * size_t(n_heads) + size_t(h)) * size_t(head_dim);
  for (int d = lane; d < head_dim; d += 32) {
    float acc = 0.0f;
    for (int s = 0; s < n_splits; ++s)
      if (part_m[first + size_t(s)] != neg_inf)
        acc += part_acc[(first + size_t(s)) * size_t(head_dim) + size_t(d)] * expf(part_m[first + size_t(s)] - m);
    out[o + size_t(d)] = l > 0.0f ? acc / l : 0.0f;
  }
}

/// Encodes n values of a row into a token-major row at byte `row`, as kernels::KvLayout::write_k / write_v do
/// (kernels/quant.cc): f32 as it is; f16 rounded to nearest even; q8_0 per block of 32, scale max|x| / 127 stored in f16,
/// values round(x / scale). Threads of the block over the elements (f16) or over the 32-value blocks (q8_0).
/// `x` is global (cu::Ptr) or shared (cu::Shared) memory.
template <class Values>
CHOREO_DEVICE inline void encode_row(KvType t, cu::Ptr<uint8_t> bytes, size_t row, Values x, int n) {
  const int threads = int(cu::block_dim().x);
  if (t == KvType::F32) {  // byte by byte: the row need not be 4-byte aligned (f32 values after q8_0 keys)
    for (int i = int(cu::thread_idx().x); i < n; i += threads) {
      const float value = x[i];
      uint32_t b;
      memcpy(&b, &value, 4);
      for (int j = 0; j < 4; ++j) bytes[row + 4 * size_t(i) + size_t(j)] = uint8_t(b >> (8 * j));
    }
    return;
  }
  if (t == KvType::F16) {
    for (int i = int(cu::thread_idx().x); i < n; i += threads) {
      const uint32_t h = float_to_half_bits(x[i]);
      bytes[row + 2 * size_t(i)] = uint8_t(h & 0xffu);
      bytes[row + 2 * size_t(i) + 1] = uint8_t(h >> 8);
    }
    return;
  }
  for (int b = int(cu::thread_idx().x); b < n / 32; b += threads) {
    float max_abs = 0.0f;
    for (int i = 0; i < 32; ++i) max_abs = fmaxf(max_abs, fabsf(x[32 * b + i]));
    const float scale = max_abs / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    const size_t at = row + size_t(b) * size_t(block_bytes(BlockFormat::Q8_0));
    const uint32_t d = float_to_half_bits(scale);
    bytes[at] = uint8_t(d & 0xffu);
    bytes[at + 1] = uint8_t(d >> 8);
    for (int i = 0; i < 32; ++i) bytes[at + 2 + size_t(i)] = uint8_t(int8_t(roundf(x[32 * b + i] * inverse)));
  }
}

/// Writes the keys and values of n tokens (rows of n_kv_heads * head_dim) of one layer into the pool: token t
/// goes to page pages[t], slot slots[t] (Backend::store_kv), in the cache's types: f32 K into its
/// head-dimension-major tile, f32 V into its row, f16 / q8_0 rows encoded. One block per token.
CHOREO_GLOBAL void store_kv(cu::Ptr<float> pool, AttnCache cache, cu::Ptr<const int32_t> pages,
                            cu::Ptr<const int32_t> slots, cu::Ptr<const float> k, cu::Ptr<const float> v) {
  const int t = int(cu::block_idx().x);
  const int kv_dim = cache.n_kv_heads * cache.head_dim;
  const size_t page_floats = page_stride_bytes(cache) / 4;
  const int page = pages[t], slot = slots[t];
  const cu::Ptr<const float> k_row = k + ptrdiff_t(t) * kv_dim, v_row = v + ptrdiff_t(t) * kv_dim;
  for (int i = int(cu::thread_idx().x); i < kv_dim; i += int(cu::block_dim().x)) {
    const int h = i / cache.head_dim, d = i % cache.head_dim;
    if (cache.k_type == KvType::F32) pool[key_at(cache, page_floats, page, h, d, slot)] = k_row[i];
    if (cache.v_type == KvType::F32 && cache.k_type == KvType::F32)
      pool[value_at(cache, page_floats, page, h, d, slot)] = v_row[i];
  }
  if (cache.k_type != KvType::F32) encode_row(cache.k_type, cu::as_bytes(pool), key_row(cache, page, slot), k_row, kv_dim);
  if (cache.v_type != KvType::F32 || cache.k_type != KvType::F32) encode_row(cache.v_type, cu::as_bytes(pool), value_row(cache, page, slot), v_row, kv_dim);
}

}  // namespace choreo::cuda::kernels
