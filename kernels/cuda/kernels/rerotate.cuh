#pragma once
// Key re-rotation (Backend::rerotate_keys): the stored keys of a page list rotated by a position delta in place,
// decoded and encoded in the cache's key type as KvLayout::read_k / write_k do. The paper's destructive
// repositioning, which the engine keeps as a reference path beside virtual repositioning.

#include <cstdint>

#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/rope.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::cuda::kernels {

/// One block per (token, layer): token t = blockIdx.x of the list lies in slot t % page_tokens of pool page
/// pages[t / page_tokens], and blockIdx.y is the layer (cache.layer is not read). The block decodes the
/// token's key row into dynamic shared memory (kv_dim floats), rotates each KV head's pairs as the rope kernel
/// rotates a row at position `delta` (the same rope_pair and rotate_pair), and after a barrier encodes the row
/// back into its slot: the whole row is read before any of it is written, so the rows may be rewritten in place.
CHOREO_GLOBAL void rerotate_keys(cu::Ptr<float> pool, AttnCache cache, cu::Ptr<const int32_t> pages, int delta,
                                 RopeArgs p, cu::Ptr<const float> factors) {
  const int t = int(cu::block_idx().x), threads = int(cu::block_dim().x);
  cache.layer = int(cu::block_idx().y);
  const int kv_dim = cache.n_kv_heads * cache.head_dim;
  const size_t page_floats = page_stride_bytes(cache) / 4;
  const int page = pages[t / cache.page_tokens], slot = t % cache.page_tokens;
  const auto row = cu::dynamic_shared<float>();
  const cu::Ptr<const float> read_pool = pool;
  for (int i = int(cu::thread_idx().x); i < kv_dim; i += threads)
    row[i] = key_element(cache, read_pool, cu::as_bytes(read_pool), page_floats, page, i / cache.head_dim,
                         i % cache.head_dim, slot);
  cu::sync_threads();
  const int half = p.n_dims / 2;
  for (int k = int(cu::thread_idx().x); k < cache.n_kv_heads * half; k += threads) {
    const int at = k / half * cache.head_dim;
    const RopePair q = rope_pair(p, factors, k % half, double(int64_t(delta)), 1);
    float x0 = row[at + q.a], x1 = row[at + q.b];
    rotate_pair(q, x0, x1);
    row[at + q.a] = x0;
    row[at + q.b] = x1;
  }
  cu::sync_threads();
  if (cache.k_type == KvType::F32) {
    for (int i = int(cu::thread_idx().x); i < kv_dim; i += threads)
      pool[key_at(cache, page_floats, page, i / cache.head_dim, i % cache.head_dim, slot)] = row[i];
  } else {
    encode_row(cache.k_type, cu::as_bytes(pool), key_row(cache, page, slot), row, kv_dim);
  }
}

}  // namespace choreo::cuda::kernels
