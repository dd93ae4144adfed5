#pragma once
// Segment attention as CUDA kernels (issue 14), written against kernels/cuda/portable.h: every query row of a
// group attends to the group's segments (cached runs of tokens in KV pages, each placed `delta` positions
// later, which the query sees by being rotated by -delta; a causal segment shows query j its first
// causal_base + j + 1 tokens), for one layer of an f32 KV pool laid out as kernels::KvLayout.
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

/// The float index of key element d of token `slot` in page `page` (K is [layer][kv_head][head_dim][slot]).
CHOREO_DEVICE inline size_t key_at(const AttnCache& c, size_t page_floats, int page, int kv_head, int d, int slot) {
  return size_t(page) * page_floats +
         (size_t(c.layer) * size_t(c.n_kv_heads) + size_t(kv_head)) * size_t(c.head_dim) * size_t(c.page_tokens) +
         size_t(d) * size_t(c.page_tokens) + size_t(slot);
}

/// The float index of value element d (V is [layer][slot] rows of n_kv_heads * head_dim, after every K).
CHOREO_DEVICE inline size_t value_at(const AttnCache& c, size_t page_floats, int page, int kv_head, int d, int slot) {
  const size_t kv_dim = size_t(c.n_kv_heads) * size_t(c.head_dim);
  return size_t(page) * page_floats + size_t(c.n_layers) * size_t(c.page_tokens) * kv_dim +
         (size_t(c.layer) * size_t(c.page_tokens) + size_t(slot)) * kv_dim + size_t(kv_head) * size_t(c.head_dim) +
         size_t(d);
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
  const size_t kv_dim = size_t(cache.n_kv_heads) * size_t(hd);
  const size_t page_floats = 2 * size_t(cache.n_layers) * size_t(cache.page_tokens) * kv_dim;
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
        for (int d = 0; d < hd; ++d) dot += q_rot[d] * pool[key_at(cache, page_floats, page, kv_head, d, slot)];
        score = dot * scale;
      }
      const float tile_max = cu::warp_max(score);
      const float m_new = tile_max > m ? tile_max : m;
      const float rescale = m == neg_inf ? 0.0f : expf(m - m_new);
      const float p = key < hi ? expf(score - m_new) : 0.0f;
      const float p_sum = cu::warp_sum(p);
      l = l * rescale + p_sum;
      for (int k = 0; k < per_lane; ++k) acc[k] *= rescale;
      const int count = hi - tile < 32 ? hi - tile : 32;
      const cu::WarpValues<float> p_of = cu::warp_values(p);
      const cu::WarpValues<int> page_of = cu::warp_values(page), slot_of = cu::warp_values(slot);
      for (int t = 0; t < 32; ++t) {
        const float pt = p_of[t];
        const int page_t = page_of[t], slot_t = slot_of[t];
        if (t >= count) continue;
        for (int k = 0; k < per_lane && lane + 32 * k < hd; ++k)
          acc[k] += pt * pool[value_at(cache, page_floats, page_t, kv_head, lane + 32 * k, slot_t)];
      }
      m = m_new;
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

/// Writes the keys and values of n tokens (rows of n_kv_heads * head_dim) of one layer into the pool: token t
/// goes to page pages[t], slot slots[t] (Backend::store_kv), K into its head-dimension-major tile, V into its
/// row. One block per token, threads over the row.
CHOREO_GLOBAL void store_kv(cu::Ptr<float> pool, AttnCache cache, cu::Ptr<const int32_t> pages,
                            cu::Ptr<const int32_t> slots, cu::Ptr<const float> k, cu::Ptr<const float> v) {
  const int t = int(cu::block_idx().x);
  const int kv_dim = cache.n_kv_heads * cache.head_dim;
  const size_t page_floats = 2 * size_t(cache.n_layers) * size_t(cache.page_tokens) * size_t(kv_dim);
  const int page = pages[t], slot = slots[t];
  for (int i = int(cu::thread_idx().x); i < kv_dim; i += int(cu::block_dim().x)) {
    const int h = i / cache.head_dim, d = i % cache.head_dim;
    pool[key_at(cache, page_floats, page, h, d, slot)] = k[size_t(t) * size_t(kv_dim) + size_t(i)];
    pool[value_at(cache, page_floats, page, h, d, slot)] = v[size_t(t) * size_t(kv_dim) + size_t(i)];
  }
}

}  // namespace choreo::cuda::kernels
