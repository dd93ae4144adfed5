#pragma once
// The CUDA backend's attention: store_kv (a layer's keys and values into their pages) and segment attention
// (kernels/cuda/kernels/attention.cuh; the tiled prefill partials, attention_tiled.cuh), the groups flattened
// and staged for the kernels.
// Part of CoreBackend (kernels/cuda/backend_core.h), the CUDA backend's host logic: compiled by nvcc for a GPU
// and by the host compiler for the block emulator.

#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/attention_tiled.cuh"

namespace choreo::cuda {

template <class Device>
void CoreBackend<Device>::store_kv(const KvLayout& kv, int layer, std::span<const PageId> pages, std::span<const int32_t> slots,
              const float* k, const float* v) {
  if (pages.empty()) return;
  require_types(kv);
  std::lock_guard lock(mutex_);
  Arena& a = arena_for(kv, pages[0]);
  std::vector<int32_t> index(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) index[i] = int32_t(page_in(a, pages[i]));
  const size_t n = pages.size(), rows = n * size_t(kv.kv_dim());
  Staging st(*this);
  const size_t at_index = st.add(std::span<const int32_t>(index)), at_slots = st.add(slots.first(n));
  st.commit();
  cu::launch("store_kv", kernels::store_kv, Dim3(unsigned(n)), Dim3(128), 0, dev_->stream(), pool(a), cache_args(kv, layer),
             st.template get<int32_t>(at_index, n), st.template get<int32_t>(at_slots, n), arg(k, rows), arg(v, rows));
  dev_->launched("store_kv");
}

template <class Device>
void CoreBackend<Device>::attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
               std::span<const choreo::kernels::AttentionGroup> groups, const choreo::kernels::RopeParams& rope,
               float scale, float* out) {
  if (n_q <= 0) return;
  require_types(kv);
  if (kv.head_dim > kernels::kMaxHeadDim)
    throw_input_error("head dimension " + std::to_string(kv.head_dim) + " is above the CUDA attention kernel's " +
                      std::to_string(kernels::kMaxHeadDim));
  std::lock_guard lock(mutex_);
  // The groups flattened for the kernels (kernel_args.h): page numbers within one arena, segments, groups.
  Arena* arena = nullptr;
  std::vector<int32_t> page_list, group_of_query(size_t(n_q), -1);
  std::vector<kernels::AttnSegment> segments;
  std::vector<kernels::AttnGroup> kgroups;
  int max_keys = 0;
  for (const choreo::kernels::AttentionGroup& g : groups) {
    if (g.q_begin < 0 || g.q_end > n_q || g.q_begin > g.q_end) throw std::logic_error("attention: a group's rows are outside the batch");
    kgroups.push_back({g.q_begin, g.q_end, int(segments.size()), int(g.segments.size())});
    int keys = 0;
    for (const choreo::kernels::KvSegment& s : g.segments) {
      if (kv.pages_for(size_t(s.n_tokens)) > s.pages.size())
        throw std::logic_error("attention: a segment has fewer pages than its tokens need");
      segments.push_back({int(page_list.size()), s.n_tokens, s.delta, s.causal_base});
      for (PageId p : s.pages) {
        if (!arena) arena = &arena_for(kv, p);
        page_list.push_back(int32_t(page_in(*arena, p)));
      }
      keys += s.n_tokens;
    }
    max_keys = std::max(max_keys, keys);
    for (int j = g.q_begin; j < g.q_end; ++j) group_of_query[size_t(j)] = int32_t(kgroups.size() - 1);
  }
  if (std::count(group_of_query.begin(), group_of_query.end(), -1) > 0)
    throw std::logic_error("attention: a query row belongs to no group");
  const int n_splits = std::max(1, (max_keys + kAttentionSplitTokens - 1) / kAttentionSplitTokens);
  const size_t parts = size_t(n_q) * size_t(n_heads) * size_t(n_splits), width = size_t(n_heads) * size_t(kv.head_dim);
  reserve(part_m_, parts * sizeof(float));
  reserve(part_l_, parts * sizeof(float));
  reserve(part_acc_, parts * size_t(kv.head_dim) * sizeof(float));
  if (page_list.empty()) page_list.push_back(0);  // a kernel argument must point somewhere
  if (segments.empty()) segments.push_back({});
  Staging st(*this);
  const size_t at_pages = st.add(std::span<const int32_t>(page_list)),
               at_segments = st.add(std::span<const kernels::AttnSegment>(segments)),
               at_groups = st.add(std::span<const kernels::AttnGroup>(kgroups)),
               at_group_of = st.add(std::span<const int32_t>(group_of_query));
  // Prefill (a group of several rows) takes the tiled kernel: key and value tiles shared by the rows of a
  // block, each row's partials attention_partials' to the bit (attention_tiled.cuh), so choosing it changes
  // no result. Above 48 KiB of shared memory (head_dim > 168) a device launch would need an opt-in: not taken.
  const bool tiled = kernels::tiled_shared_bytes(kv.head_dim) <= 48 * 1024 &&
                     std::any_of(kgroups.begin(), kgroups.end(), [](const kernels::AttnGroup& g) { return g.q_end - g.q_begin > 1; });
  const std::vector<kernels::AttnTiledBlock> blocks =
      tiled ? kernels::tiled_blocks(kgroups.data(), int(kgroups.size())) : std::vector<kernels::AttnTiledBlock>();
  const size_t at_blocks = st.add(std::span<const kernels::AttnTiledBlock>(blocks));
  const std::optional<size_t> at_factors = stage_factors(st, rope);
  st.commit();
  const kernels::AttnCache cache = cache_args(kv, layer);
  const cu::Ptr<float> m = floats(part_m_, parts), l = floats(part_l_, parts),
                       acc = floats(part_acc_, parts * size_t(kv.head_dim));
  const cu::Ptr<float> kv_pool = arena ? pool(*arena) : cu::make_ptr(static_cast<float*>(dummy_), 16);
  if (tiled) {
    cu::launch("attention_partials_tiled", kernels::attention_partials_tiled,
               Dim3(unsigned(blocks.size()), unsigned(n_heads), unsigned(n_splits)), Dim3(kernels::kTiledThreads),
               kernels::tiled_shared_bytes(kv.head_dim), dev_->stream(), arg(q, size_t(n_q) * width), n_heads, kv_pool,
               cache, st.template get<int32_t>(at_pages, page_list.size()),
               st.template get<kernels::AttnSegment>(at_segments, segments.size()),
               st.template get<kernels::AttnGroup>(at_groups, kgroups.size()),
               st.template get<kernels::AttnTiledBlock>(at_blocks, blocks.size()), rope_args(rope),
               factors(st, rope, at_factors), scale, kAttentionSplitTokens, n_splits, m, l, acc);
    dev_->launched("attention_partials_tiled");
  } else {
    cu::launch("attention_partials", kernels::attention_partials, Dim3(unsigned(n_q), unsigned(n_heads), unsigned(n_splits)),
               Dim3(32), 0, dev_->stream(), arg(q, size_t(n_q) * width), n_heads, kv_pool, cache,
               st.template get<int32_t>(at_pages, page_list.size()),
               st.template get<kernels::AttnSegment>(at_segments, segments.size()),
               st.template get<kernels::AttnGroup>(at_groups, kgroups.size()),
               st.template get<int32_t>(at_group_of, group_of_query.size()), rope_args(rope),
               factors(st, rope, at_factors), scale, kAttentionSplitTokens, n_splits, m, l, acc);
    dev_->launched("attention_partials");
  }
  cu::launch("attention_combine", kernels::attention_combine, Dim3(unsigned(n_q), unsigned(n_heads)), Dim3(32), 0,
             dev_->stream(), n_heads, kv.head_dim, n_splits, cu::Ptr<const float>(m), cu::Ptr<const float>(l),
             cu::Ptr<const float>(acc), arg(out, size_t(n_q) * width));
  dev_->launched("attention_combine");
}

}  // namespace choreo::cuda
