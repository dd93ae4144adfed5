#pragma once
// Tiled prefill segment attention (issue 14): attention_partials (attention.cuh) with the keys and values shared
// by the query rows of a group. In prefill every row of a group reads the same keys; attention_partials reads
// them from global memory once per row, this kernel once per block of kTiledRows rows.
//
// attention_partials_tiled: one block of kTiledRows warps per (tile of up to kTiledRows consecutive query rows
// of one group, head, split); warp w computes row first_row + w. For each segment the block loads every 32-key
// tile of the split's keys, decoded, into shared memory (all threads together), and each warp then does exactly
// what attention_partials' warp does for its row: the same dot products in the same order, the same
// warp_max / warp_sum / warp_values, the same online-softmax update, the same accumulation order over keys and
// dimensions. Only where a key or value element is read from changes, so every row's (m, l, acc) is
// attention_partials' to the bit, and the combine kernel, batch invariance and every test of attention.cuh
// carry over. Rows past their group's end (the last tile of a group) compute nothing but reach every barrier.
//
// Rows of one group see different numbers of keys of a causal segment (visible_keys), so the shared tile covers
// the union of the rows' windows and each warp reads only its own keys. A row's 32-key tiles start at its own
// first key of the split in the segment; rows share tiles when those starts agree, which they always do when the
// group's only causal segment is its last (a call's own tokens after its parents, as prefill has them: every
// segment before it shows all rows the same keys). A causal segment followed by more segments shifts the later
// segments' windows by row; in a split that starts inside such a segment the rows' tiles do not line up, and
// there each warp reads its keys from global memory as attention_partials does (the same operations, so the
// same bits).
//
// Shared memory (dynamic, tiled_shared_bytes(head_dim) bytes: cu::dynamic_shared, since the static limit of
// 48 KiB cannot hold the tiles of head_dim 256):
//   q_rot  [kTiledRows][head_dim]   each warp's query, rotated by -delta for the segment (a row each)
//   keys   [head_dim][33]           the tile's keys, dimension-major: lane t reads word d * 33 + t (consecutive
//                                   lanes, consecutive banks); the pad of one makes a store of one key's
//                                   consecutive dimensions (f16 / q8_0 rows) conflict-free too
//   values [32][head_dim]           the tile's values, token-major: lanes read consecutive dimensions of key t
// 4 * (kTiledRows + 65) * head_dim bytes: 18.3 KiB at head_dim 64, 73 KiB at 256 (above 48 KiB a device launch
// raises the kernel's dynamic shared memory limit first: kernels/cuda/attention.cu).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/rope.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// Query rows (warps) per block of attention_partials_tiled.
inline constexpr int kTiledRows = 8;
inline constexpr int kTiledThreads = 32 * kTiledRows;
/// Words between consecutive dimensions of the shared key tile (32 keys and a pad).
inline constexpr int kTiledKeyStride = 33;

/// One block of attention_partials_tiled: rows [first_row, min(first_row + kTiledRows, q_end)) of group `group`.
struct AttnTiledBlock {
  int group = 0;
  int first_row = 0;
};

/// Dynamic shared memory of attention_partials_tiled for a head dimension, in bytes.
CHOREO_HOST_DEVICE constexpr size_t tiled_shared_bytes(int head_dim) {
  return sizeof(float) * size_t(kTiledRows + kTiledKeyStride + 32) * size_t(head_dim);
}

/// Blocks of attention_partials_tiled for groups[0, n_groups): each group's rows in tiles of kTiledRows, in
/// order (a group of n rows takes ceil(n / kTiledRows) blocks; an empty group none). `blocks`, when not null,
/// receives them; returns how many. Host and device code alike (no allocation).
CHOREO_HOST_DEVICE constexpr int tiled_blocks(const AttnGroup* groups, int n_groups, AttnTiledBlock* blocks) {
  int n = 0;
  for (int g = 0; g < n_groups; ++g)
    for (int row = groups[g].q_begin; row < groups[g].q_end; row += kTiledRows) {
      if (blocks) blocks[n] = {g, row};
      ++n;
    }
  return n;
}
/// The same as a vector (host code).
inline std::vector<AttnTiledBlock> tiled_blocks(const AttnGroup* groups, int n_groups) {
  std::vector<AttnTiledBlock> blocks(size_t(tiled_blocks(groups, n_groups, nullptr)));
  tiled_blocks(groups, n_groups, blocks.data());
  return blocks;
}

/// attention_partials over `blocks` (tiled_blocks of the groups) instead of one block per query row: the grid is
/// (number of blocks, n_heads, n_splits), kTiledThreads threads per block, tiled_shared_bytes(head_dim) bytes of
/// dynamic shared memory. Writes the partials attention_partials writes, at the same places, with its bits.
CHOREO_GLOBAL void attention_partials_tiled(cu::Ptr<const float> q, int n_heads, cu::Ptr<const float> pool,
                                            AttnCache cache, cu::Ptr<const int32_t> page_list,
                                            cu::Ptr<const AttnSegment> segments, cu::Ptr<const AttnGroup> groups,
                                            cu::Ptr<const AttnTiledBlock> blocks, RopeArgs rope,
                                            cu::Ptr<const float> factors, float scale, int split_tokens, int n_splits,
                                            cu::Ptr<float> part_m, cu::Ptr<float> part_l, cu::Ptr<float> part_acc) {
  const cu::Shared<float> shared = cu::dynamic_shared<float>();
  const int h = int(cu::block_idx().y), split = int(cu::block_idx().z);
  const int tid = int(cu::thread_idx().x), warp = tid / 32, lane = int(cu::lane_id()), hd = cache.head_dim;
  const int kv_head = h / (n_heads / cache.n_kv_heads);
  const size_t page_floats = page_stride_bytes(cache) / 4;
  const cu::Ptr<const uint8_t> pool_bytes = cu::as_bytes(pool);
  const AttnTiledBlock block = blocks[int(cu::block_idx().x)];
  const AttnGroup g = groups[block.group];
  const int rows = g.q_end - block.first_row < kTiledRows ? g.q_end - block.first_row : kTiledRows;
  const int row = block.first_row + warp;  // this warp's row (live when warp < rows)
  const int q_at = warp * hd, keys_at = kTiledRows * hd, values_at = keys_at + kTiledKeyStride * hd;
  const int first = split * split_tokens, last = first + split_tokens;  // this split's keys [first, last)
  const float neg_inf = -cu::bits_to_float(0x7f800000u);
  const int per_lane = (hd + 31) / 32;  // output dimensions lane + 32 k of this lane
  float m = neg_inf, l = 0.0f;
  float acc[kMaxHeadDim / 32];
  for (int k = 0; k < per_lane; ++k) acc[k] = 0.0f;
  // Index of the segment's first key among the group's visible keys, for every row of the block: each thread
  // computes every row's window, so that what the block loads and which path it takes are the same in every
  // thread, and no barrier is divergent.
  int base[kTiledRows];
  for (int r = 0; r < kTiledRows; ++r) base[r] = 0;
  for (int s = 0; s < g.n_segments; ++s) {
    const AttnSegment seg = segments[g.first_segment + s];
    int lo = 0, hi = 0;                // this warp's window [lo, hi) of the segment's keys
    int lo_all = 0, hi_all = 0;        // the first start of a non-empty window, and the windows' union end
    bool any = false, aligned = true;  // some row has keys here; all non-empty windows start at lo_all
    for (int r = 0; r < rows; ++r) {
      const int n = visible_keys(seg, block.first_row - g.q_begin + r);
      const int lo_r = first > base[r] ? first - base[r] : 0, hi_r = (last - base[r]) < n ? last - base[r] : n;
      base[r] += n;
      if (r == warp) {
        lo = lo_r;
        hi = hi_r;
      }
      if (lo_r >= hi_r) continue;
      if (!any) lo_all = lo_r;
      aligned = aligned && lo_r == lo_all;
      hi_all = hi_r > hi_all ? hi_r : hi_all;
      any = true;
    }
    if (!any) continue;
    // Each warp's query of this head, rotated by -delta for this segment's placement (attention_partials' code
    // on the warp's own row of q_rot).
    cu::sync_threads();
    if (lo < hi) {
      const size_t q_row = (size_t(row) * size_t(n_heads) + size_t(h)) * size_t(hd);
      for (int d = lane; d < hd; d += 32) shared[q_at + d] = q[q_row + size_t(d)];
    }
    cu::sync_threads();
    if (seg.delta != 0) {
      if (lo < hi)
        for (int i = lane; i < rope.n_dims / 2; i += 32) {
          const RopePair pr = rope_pair(rope, factors, i, -double(seg.delta), 1);
          const float x0 = shared[q_at + pr.a], x1 = shared[q_at + pr.b];
          shared[q_at + pr.a] = x0 * pr.c - x1 * pr.s;
          shared[q_at + pr.b] = x0 * pr.s + x1 * pr.c;
        }
      cu::sync_threads();
    }
    if (!aligned) {
      // The rows' tiles do not line up (see the top of the file): attention_partials' loop, from global memory
      // (none for a warp without keys here).
      for (int tile = lo; tile < hi; tile += 32) {
        const int key = tile + lane;
        float score = neg_inf;
        int page = 0, slot = 0;
        if (key < hi) {
          page = page_list[seg.first_page + key / cache.page_tokens];
          slot = key % cache.page_tokens;
          float dot = 0.0f;
          for (int d = 0; d < hd; ++d)
            dot += shared[q_at + d] * key_element(cache, pool, pool_bytes, page_floats, page, kv_head, d, slot);
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
      continue;
    }
    for (int tile = lo_all; tile < hi_all; tile += 32) {
      // The block loads keys [tile, tile + loaded) of the segment: the union of its rows' tiles.
      const int loaded = hi_all - tile < 32 ? hi_all - tile : 32;
      // f32 keys are head-dimension-major in a page (a dimension's slots adjacent): consecutive threads take
      // consecutive keys. f16 / q8_0 keys and all values are token-major rows: consecutive dimensions.
      const bool key_major = cache.k_type == KvType::F32;
      for (int e = tid; e < loaded * hd; e += kTiledThreads) {
        const int t = key_major ? e % loaded : e / hd, d = key_major ? e / loaded : e % hd, key = tile + t;
        const int page = page_list[seg.first_page + key / cache.page_tokens], slot = key % cache.page_tokens;
        shared[keys_at + d * kTiledKeyStride + t] =
            key_element(cache, pool, pool_bytes, page_floats, page, kv_head, d, slot);
      }
      for (int e = tid; e < loaded * hd; e += kTiledThreads) {
        const int t = e / hd, d = e % hd, key = tile + t;
        const int page = page_list[seg.first_page + key / cache.page_tokens], slot = key % cache.page_tokens;
        shared[values_at + e] = value_element(cache, pool, pool_bytes, page_floats, page, kv_head, d, slot);
      }
      cu::sync_threads();
      if (lo < hi && tile < hi) {  // this warp's tile [tile, tile + 32) of its window: attention_partials' step
        const int key = tile + lane;
        float score = neg_inf;
        if (key < hi) {
          float dot = 0.0f;
          for (int d = 0; d < hd; ++d) dot += shared[q_at + d] * shared[keys_at + d * kTiledKeyStride + lane];
          score = dot * scale;
        }
        const float p = online_softmax_tile(score, key < hi, m, l, acc, per_lane);
        const int count = hi - tile < 32 ? hi - tile : 32;
        const cu::WarpValues<float> p_of = cu::warp_values(p);
        for (int t = 0; t < 32; ++t) {
          const float pt = p_of[t];
          if (t >= count) continue;
          for (int k = 0; k < per_lane && lane + 32 * k < hd; ++k)
            acc[k] += pt * shared[values_at + t * hd + lane + 32 * k];
        }
      }
      cu::sync_threads();  // every warp is done with this tile before the next one overwrites it
    }
  }
  if (warp >= rows) return;
  const size_t at = (size_t(row) * size_t(n_heads) + size_t(h)) * size_t(n_splits) + size_t(split);
  if (lane == 0) {
    part_m[at] = m;
    part_l[at] = l;
  }
  for (int k = 0; k < per_lane && lane + 32 * k < hd; ++k) part_acc[at * size_t(hd) + size_t(lane + 32 * k)] = acc[k];
}

}  // namespace choreo::cuda::kernels
