// choreo's CUDA segment attention (kernels/cuda/kernels/attention.cuh) in the block emulator (issue 14), against
// the CPU backend's attention over the same f32 KV pages: groups of queries over reordered, overlapping,
// repositioned (delta != 0) and causal segments spanning several pages, for the head shapes of stories260K
// (head_dim 8, no GQA) and SmolLM2-135M (head_dim 64, 9 heads over 3 KV heads); a query's bits do not depend
// on the rest of its batch (batch invariance: alone, in a batch, and with more splits than it needs).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "tests/cuda/random_values.h"

namespace choreo::cuda {
namespace {

using cu::make_ptr;
using testing::random_values;

struct HeadShape {
  int n_heads, n_kv_heads, head_dim;
};

/// A KV pool of random f32 pages, held both by the CPU backend (page ids) and as one array (the kernel's pool).
struct Pool {
  ::choreo::kernels::KvLayout layout;
  std::unique_ptr<::choreo::kernels::Backend> cpu = ::choreo::kernels::make_cpu_backend(1);
  std::vector<::choreo::kernels::PageId> ids;
  std::vector<float> floats;
  Pool(const HeadShape& s, int n_pages) {
    layout.page_tokens = 16;
    layout.n_layers = 2;
    layout.n_kv_heads = s.n_kv_heads;
    layout.head_dim = s.head_dim;
    const size_t page_floats = layout.page_bytes() / sizeof(float);
    floats = random_values(page_floats * size_t(n_pages), 42, 2.0f);
    for (int p = 0; p < n_pages; ++p) {
      ids.push_back(cpu->alloc_page(layout.page_bytes()));
      cpu->copy_from_host(floats.data() + size_t(p) * page_floats, ids.back(), {0, layout.page_bytes()}).wait();
    }
  }
};

/// One group's segments as (pool page indices, tokens, delta, causal_base).
struct Seg {
  std::vector<int> pages;
  int n_tokens, delta, causal_base;
};
struct Group {
  int n_q;
  std::vector<Seg> segs;
};

/// Runs the groups through the CPU backend and through the emulated kernels (with at least `min_splits`
/// splits of `split_tokens`); returns (cpu, emulated) outputs.
std::pair<std::vector<float>, std::vector<float>> run(const Pool& pool, const HeadShape& s, const std::vector<Group>& groups,
                                                      const std::vector<float>& q, int split_tokens, int min_splits = 1) {
  const int layer = 1, n_q = int(q.size()) / (s.n_heads * s.head_dim);
  ::choreo::kernels::RopeParams rope;
  rope.n_dims = s.head_dim;
  rope.freq_base = 10000.0f;
  const float scale = 1.0f / std::sqrt(float(s.head_dim));
  // CPU.
  std::vector<std::vector<::choreo::kernels::PageId>> page_ids;
  std::vector<std::vector<::choreo::kernels::KvSegment>> cpu_segs(groups.size());
  for (const Group& g : groups)
    for (const Seg& sg : g.segs) {
      std::vector<::choreo::kernels::PageId> ids;
      for (int p : sg.pages) ids.push_back(pool.ids[size_t(p)]);
      page_ids.push_back(std::move(ids));
    }
  std::vector<::choreo::kernels::AttentionGroup> cpu_groups;
  size_t k = 0;
  int q_at = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (const Seg& sg : groups[gi].segs) cpu_segs[gi].push_back({page_ids[k++], sg.n_tokens, sg.delta, sg.causal_base});
    cpu_groups.push_back({q_at, q_at + groups[gi].n_q, cpu_segs[gi]});
    q_at += groups[gi].n_q;
  }
  std::vector<float> want(q.size());
  pool.cpu->attention(layer, q.data(), n_q, s.n_heads, pool.layout, cpu_groups, rope, scale, want.data());
  // Emulated kernels.
  std::vector<int32_t> page_list, group_of_query;
  std::vector<kernels::AttnSegment> segs;
  std::vector<kernels::AttnGroup> kgroups;
  int max_keys = 0;
  q_at = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    kgroups.push_back({q_at, q_at + g.n_q, int(segs.size()), int(g.segs.size())});
    int keys = 0;
    for (const Seg& sg : g.segs) {
      segs.push_back({int(page_list.size()), sg.n_tokens, sg.delta, sg.causal_base});
      page_list.insert(page_list.end(), sg.pages.begin(), sg.pages.end());
      keys += sg.n_tokens;
    }
    max_keys = std::max(max_keys, keys);
    for (int j = 0; j < g.n_q; ++j) group_of_query.push_back(int(gi));
    q_at += g.n_q;
  }
  const int n_splits = std::max(min_splits, (max_keys + split_tokens - 1) / split_tokens);
  const size_t parts = size_t(n_q) * size_t(s.n_heads) * size_t(n_splits);
  std::vector<float> m(parts), l(parts), acc(parts * size_t(s.head_dim)), got(q.size(), -9.0f);
  const kernels::AttnCache cache{pool.layout.n_layers, s.n_kv_heads, s.head_dim, pool.layout.page_tokens, layer};
  cu::launch("attention_partials", kernels::attention_partials, Dim3(unsigned(n_q), unsigned(s.n_heads), unsigned(n_splits)),
             Dim3(32), 0, nullptr, make_ptr(q.data(), q.size()), s.n_heads, make_ptr(pool.floats.data(), pool.floats.size()),
             cache, make_ptr(page_list.data(), page_list.size()), make_ptr(segs.data(), segs.size()),
             make_ptr(kgroups.data(), kgroups.size()), make_ptr(group_of_query.data(), group_of_query.size()),
             kernels::RopeArgs{s.head_dim, rope.freq_base, 1, 0}, cu::Ptr<const float>(), scale, split_tokens, n_splits,
             make_ptr(m.data(), m.size()), make_ptr(l.data(), l.size()), make_ptr(acc.data(), acc.size()));
  cu::launch("attention_combine", kernels::attention_combine, Dim3(unsigned(n_q), unsigned(s.n_heads)), Dim3(32), 0,
             nullptr, s.n_heads, s.head_dim, n_splits, make_ptr(m.data(), m.size()), make_ptr(l.data(), l.size()),
             make_ptr(acc.data(), acc.size()), make_ptr(got.data(), got.size()));
  return {want, got};
}

double worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

TEST_CASE("cuda kernels (emulated): segment attention equals the CPU backend's over reordered, repositioned and causal segments") {
  for (const HeadShape s : {HeadShape{8, 8, 8}, HeadShape{9, 3, 64}}) {
    const Pool pool(s, 12);
    // Group 0: two parents (the second placed 5 positions later, two pages, the first only partly read) and
    // the call's own 5 tokens, causal. Group 1: one decode query over the parents reordered and overlapping.
    const std::vector<Group> groups = {
        {5, {{{0, 1, 2}, 40, 0, -1}, {{3, 4}, 27, 5, -1}, {{5}, 5, 0, 0}}},
        {1, {{{3, 4}, 30, -12, -1}, {{0, 1}, 20, 30, -1}, {{1, 2}, 32, 7, -1}, {{6}, 1, 0, 0}}},
    };
    const std::vector<float> q = random_values(size_t(6) * s.n_heads * s.head_dim, 7);
    CAPTURE(s.head_dim);
    for (int split_tokens : {8, 64, 1024}) {
      const auto [want, got] = run(pool, s, groups, q, split_tokens);
      CAPTURE(split_tokens);
      double largest = 0;
      for (float v : want) largest = std::max(largest, double(std::abs(v)));
      MESSAGE("head_dim ", s.head_dim, ", split ", split_tokens, ": worst |difference| ", worst_difference(want, got),
              " of a largest ", largest);
      CHECK(largest > 0.1);
      CHECK(worst_difference(want, got) < 2e-5);
    }
  }
}

TEST_CASE("cuda kernels (emulated): segment attention is batch invariant") {
  const HeadShape s{9, 3, 64};
  const Pool pool(s, 12);
  const Group decode{1, {{{3, 4}, 30, -12, -1}, {{0, 1}, 20, 30, -1}, {{7}, 1, 0, 0}}};
  const Group prefill{4, {{{0, 1, 2, 8}, 60, 0, -1}, {{9}, 4, 0, 0}}};
  const std::vector<float> q_decode = random_values(size_t(s.n_heads) * s.head_dim, 8);
  std::vector<float> q_batch = random_values(size_t(4) * s.n_heads * s.head_dim, 9);
  q_batch.insert(q_batch.end(), q_decode.begin(), q_decode.end());  // the decode query last
  const auto alone = run(pool, s, {decode}, q_decode, 16).second;
  const auto batched = run(pool, s, {prefill, decode}, q_batch, 16).second;
  const auto more_splits = run(pool, s, {decode}, q_decode, 16, 9).second;
  const std::vector<float> in_batch(batched.end() - std::ptrdiff_t(alone.size()), batched.end());
  CHECK(std::memcmp(in_batch.data(), alone.data(), alone.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(more_splits.data(), alone.data(), alone.size() * sizeof(float)) == 0);
}

TEST_CASE("cuda kernels (emulated): store_kv writes the pages KvLayout::write_k and write_v write") {
  const HeadShape s{9, 3, 64};
  ::choreo::kernels::KvLayout layout;
  layout.page_tokens = 16;
  layout.n_layers = 3;
  layout.n_kv_heads = s.n_kv_heads;
  layout.head_dim = s.head_dim;
  const size_t page_floats = layout.page_bytes() / sizeof(float);
  const int n = 21, layer = 2;
  const std::vector<float> k = random_values(size_t(n) * layout.kv_dim(), 10), v = random_values(size_t(n) * layout.kv_dim(), 11);
  std::vector<int32_t> pages(n), slots(n);
  for (int t = 0; t < n; ++t) {
    pages[size_t(t)] = t < 9 ? 2 : 0;  // tokens land in two pages, not in order
    slots[size_t(t)] = t < 9 ? 7 + t : (t * 5) % 16;
  }
  std::vector<float> want = random_values(page_floats * 3, 12), got = want;
  for (int t = 0; t < n; ++t) {
    std::byte* page = reinterpret_cast<std::byte*>(want.data() + size_t(pages[size_t(t)]) * page_floats);
    layout.write_k(page, layer, slots[size_t(t)], k.data() + size_t(t) * layout.kv_dim());
    layout.write_v(page, layer, slots[size_t(t)], v.data() + size_t(t) * layout.kv_dim());
  }
  const kernels::AttnCache cache{layout.n_layers, s.n_kv_heads, s.head_dim, layout.page_tokens, layer};
  cu::launch("store_kv", kernels::store_kv, Dim3(n), Dim3(64), 0, nullptr, make_ptr(got.data(), got.size()), cache,
             make_ptr(pages.data(), pages.size()), make_ptr(slots.data(), slots.size()), make_ptr(k.data(), k.size()),
             make_ptr(v.data(), v.size()));
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace choreo::cuda
