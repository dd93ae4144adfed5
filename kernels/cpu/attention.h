#pragma once
// Segment attention on the CPU: flash-style online softmax over a list of KV segments (page lists), each with
// its own position shift, applied to the query (virtual repositioning). Cost is proportional to what a query
// sees, never to the size of the cache, and no mask is materialised.

#include <span>

#include "kernels/backend.h"

namespace choreo::kernels::cpu {

class PageTable;

/// `pages` resolves the page ids of the segments.
void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv, const PageTable& pages,
               std::span<const AttentionGroup> groups, const RopeParams& rope, float scale, float* out);

}  // namespace choreo::kernels::cpu
