// The tiled prefill attention kernel (kernels/cuda/kernels/attention_tiled.cuh) in the block emulator (issue 14):
// its partials (m, l, acc) are attention_partials' bit for bit, for prefill groups of 1, 3, kTiledRows,
// kTiledRows + 1 and 2 kTiledRows + 3 rows (a block of one row, a partial block, a full one, a full one and a
// row, two full ones and a partial one), alone and all in one launch, over two parents (one repositioned, one
// partly read) and the call's own causal tokens; for stories260K's heads (8 over 4 KV heads of 8) and SmolLM2's
// (9 over 3 KV heads of 64), KV pages in f32, f16, q8_0 and q8_0 keys with f32 values, splits of 64 and 256
// keys. Also a group whose causal segment comes first (the rows' tiles of the later segments do not line up:
// the kernel's path through global memory), and the block table. The emulator stops a launch with an
// EmulationError on any shared-memory race, divergent barrier or out-of-bounds access.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/attention_tiled.cuh"
#include "tests/cuda/random_values.h"

namespace choreo::cuda {
namespace {

using ::choreo::kernels::DType;
using cu::make_ptr;
using kernels::kTiledRows;
using testing::random_values;

struct HeadShape {
  int n_heads, n_kv_heads, head_dim;
};

kernels::KvType kv_type(DType t) {
  return t == DType::F32 ? kernels::KvType::F32 : t == DType::F16 ? kernels::KvType::F16 : kernels::KvType::Q8_0;
}

/// A KV pool of n_pages pages in the kernels' layout (page_stride_bytes apart): every token of every layer a
/// random key and value row, encoded by KvLayout::write_k / write_v in the cache types.
struct Pool {
  kernels::AttnCache cache;
  std::vector<float> floats;
  Pool(const HeadShape& s, DType k_type, DType v_type, int n_pages) {
    ::choreo::kernels::KvLayout layout;
    layout.page_tokens = 16;
    layout.n_layers = 2;
    layout.n_kv_heads = s.n_kv_heads;
    layout.head_dim = s.head_dim;
    layout.k_type = k_type;
    layout.v_type = v_type;
    cache = {layout.n_layers, s.n_kv_heads, s.head_dim, layout.page_tokens, 1, kv_type(k_type), kv_type(v_type)};
    const size_t stride = kernels::page_stride_bytes(cache), kv_dim = size_t(layout.kv_dim());
    REQUIRE(stride >= layout.page_bytes());
    floats.assign(stride / 4 * size_t(n_pages), 0.0f);
    const size_t rows = size_t(n_pages) * size_t(layout.n_layers) * size_t(layout.page_tokens);
    const std::vector<float> kv = random_values(2 * rows * kv_dim, 42, 2.0f);
    size_t at = 0;
    for (int p = 0; p < n_pages; ++p) {
      std::byte* page = reinterpret_cast<std::byte*>(floats.data()) + size_t(p) * stride;
      for (int layer = 0; layer < layout.n_layers; ++layer)
        for (int slot = 0; slot < layout.page_tokens; ++slot) {
          layout.write_k(page, layer, slot, kv.data() + at);
          layout.write_v(page, layer, slot, kv.data() + at + kv_dim);
          at += 2 * kv_dim;
        }
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

struct Partials {
  std::vector<float> m, l, acc;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(const Partials& a, const Partials& b) {
  return same_bits(a.m, b.m) && same_bits(a.l, b.l) && same_bits(a.acc, b.acc);
}

/// Runs the groups (queries q, rows in group order) through attention_partials and attention_partials_tiled
/// with at least `min_splits` splits of `split_tokens`; returns both kernels' partials. Every partial starts as
/// a NaN pattern, so that one the tiled kernel leaves unwritten differs.
std::pair<Partials, Partials> run(const Pool& pool, const HeadShape& s, const std::vector<Group>& groups,
                                  const std::vector<float>& q, int split_tokens, int min_splits = 1) {
  const int n_q = int(q.size()) / (s.n_heads * s.head_dim);
  const kernels::RopeArgs rope{s.head_dim, 10000.0f, 1, 0};
  const float scale = 1.0f / std::sqrt(float(s.head_dim));
  std::vector<int32_t> page_list, group_of_query;
  std::vector<kernels::AttnSegment> segs;
  std::vector<kernels::AttnGroup> kgroups;
  int max_keys = 0, q_at = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    kgroups.push_back({q_at, q_at + g.n_q, int(segs.size()), int(g.segs.size())});
    int keys = 0;
    for (const Seg& sg : g.segs) {
      REQUIRE(int(sg.pages.size()) * pool.cache.page_tokens >= sg.n_tokens);
      segs.push_back({int(page_list.size()), sg.n_tokens, sg.delta, sg.causal_base});
      page_list.insert(page_list.end(), sg.pages.begin(), sg.pages.end());
      keys += sg.n_tokens;
    }
    max_keys = std::max(max_keys, keys);
    group_of_query.insert(group_of_query.end(), size_t(g.n_q), int32_t(gi));
    q_at += g.n_q;
  }
  REQUIRE(q_at == n_q);
  const int n_splits = std::max(min_splits, (max_keys + split_tokens - 1) / split_tokens);
  const size_t parts = size_t(n_q) * size_t(s.n_heads) * size_t(n_splits);
  const float unwritten = cu::bits_to_float(0x7fc0beefu);
  Partials want{std::vector<float>(parts, unwritten), std::vector<float>(parts, unwritten),
                std::vector<float>(parts * size_t(s.head_dim), unwritten)};
  Partials got = want;
  cu::launch("attention_partials", kernels::attention_partials,
             Dim3(unsigned(n_q), unsigned(s.n_heads), unsigned(n_splits)), Dim3(32), 0, nullptr,
             make_ptr(q.data(), q.size()), s.n_heads, make_ptr(pool.floats.data(), pool.floats.size()), pool.cache,
             make_ptr(page_list.data(), page_list.size()), make_ptr(segs.data(), segs.size()),
             make_ptr(kgroups.data(), kgroups.size()), make_ptr(group_of_query.data(), group_of_query.size()), rope,
             cu::Ptr<const float>(), scale, split_tokens, n_splits, make_ptr(want.m.data(), parts),
             make_ptr(want.l.data(), parts), make_ptr(want.acc.data(), want.acc.size()));
  const std::vector<kernels::AttnTiledBlock> blocks = kernels::tiled_blocks(kgroups.data(), int(kgroups.size()));
  cu::launch("attention_partials_tiled", kernels::attention_partials_tiled,
             Dim3(unsigned(blocks.size()), unsigned(s.n_heads), unsigned(n_splits)), Dim3(kernels::kTiledThreads),
             kernels::tiled_shared_bytes(s.head_dim), nullptr, make_ptr(q.data(), q.size()), s.n_heads,
             make_ptr(pool.floats.data(), pool.floats.size()), pool.cache, make_ptr(page_list.data(), page_list.size()),
             make_ptr(segs.data(), segs.size()), make_ptr(kgroups.data(), kgroups.size()),
             make_ptr(blocks.data(), blocks.size()), rope, cu::Ptr<const float>(), scale, split_tokens, n_splits,
             make_ptr(got.m.data(), parts), make_ptr(got.l.data(), parts), make_ptr(got.acc.data(), got.acc.size()));
  return {want, got};
}

/// The rows [first, first + n) of partials with n_heads * n_splits entries per row.
Partials rows_of(const Partials& p, size_t per_row, size_t head_dim, size_t first, size_t n) {
  const auto cut = [](const std::vector<float>& v, size_t from, size_t count) {
    return std::vector<float>(v.begin() + std::ptrdiff_t(from), v.begin() + std::ptrdiff_t(from + count));
  };
  return {cut(p.m, first * per_row, n * per_row), cut(p.l, first * per_row, n * per_row),
          cut(p.acc, first * per_row * head_dim, n * per_row * head_dim)};
}

/// A prefill group of n rows: a parent of 70 tokens in place, a parent of 45 tokens (three pages, the last
/// partly read) placed 9 positions later, and the call's own n tokens after `own_base` earlier ones, causal.
Group prefill(int n, int own_base) {
  return {n, {{{0, 1, 2, 3, 4}, 70, 0, -1}, {{5, 6, 7}, 45, 9, -1}, {{8, 9}, own_base + n, 0, own_base}}};
}

TEST_CASE("cuda kernels (emulated): the tiled prefill attention kernel's partials are attention_partials' bits") {
  const std::vector<int> sizes = {1, 3, kTiledRows, kTiledRows + 1, 2 * kTiledRows + 3};
  struct Case {
    HeadShape shape;
    DType k_type, v_type;
  };
  // q8_0 rows need heads of a multiple of 32 (KvLayout::check), so stories260K's heads of 8 take f32 and f16.
  const std::vector<Case> cases = {
      {{8, 4, 8}, DType::F32, DType::F32},    {{8, 4, 8}, DType::F16, DType::F16},
      {{9, 3, 64}, DType::F32, DType::F32},   {{9, 3, 64}, DType::F16, DType::F16},
      {{9, 3, 64}, DType::Q8_0, DType::Q8_0}, {{9, 3, 64}, DType::Q8_0, DType::F32},
  };
  for (const Case& c : cases) {
    const HeadShape s = c.shape;
    const Pool pool(s, c.k_type, c.v_type, 10);
    CAPTURE(s.head_dim);
    CAPTURE(int(c.k_type));
    CAPTURE(int(c.v_type));
    const size_t row_floats = size_t(s.n_heads) * size_t(s.head_dim);
    std::vector<Group> all;
    std::vector<float> q_all;
    for (size_t i = 0; i < sizes.size(); ++i) {
      all.push_back(prefill(sizes[i], i % 2 == 0 ? 0 : 2));  // some own segments continue 2 earlier tokens
      const std::vector<float> q = random_values(size_t(sizes[i]) * row_floats, 7 + unsigned(i));
      q_all.insert(q_all.end(), q.begin(), q.end());
    }
    for (int split_tokens : {64, 256}) {
      CAPTURE(split_tokens);
      // Every group in one launch (two to five blocks a group): the same bits as attention_partials.
      const auto [want, got] = run(pool, s, all, q_all, split_tokens);
      CHECK(same_bits(want, got));
      const int n_splits = int(want.m.size()) / (int(q_all.size() / row_floats) * s.n_heads);
      const size_t per_row = size_t(s.n_heads) * size_t(n_splits);
      // Each group alone (as few splits as it needs, at least those of the batch for comparison): its own bits,
      // and those it has in the batch (the tiled kernel is batch invariant too).
      size_t first_row = 0, q_first = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        CAPTURE(sizes[i]);
        const std::vector<float> q(q_all.begin() + std::ptrdiff_t(q_first),
                                   q_all.begin() + std::ptrdiff_t(q_first + size_t(sizes[i]) * row_floats));
        const auto [want_alone, got_alone] = run(pool, s, {all[i]}, q, split_tokens, n_splits);
        CHECK(same_bits(want_alone, got_alone));
        CHECK(same_bits(got_alone, rows_of(got, per_row, size_t(s.head_dim), first_row, size_t(sizes[i]))));
        first_row += size_t(sizes[i]);
        q_first += size_t(sizes[i]) * row_floats;
      }
      // The comparison means something: partials with keys, and splits without (m = -inf, l = 0).
      const auto with_keys = std::count_if(want.l.begin(), want.l.end(), [](float v) { return v > 0.0f; });
      CHECK(with_keys > 0);
      if (split_tokens == 64) CHECK(size_t(with_keys) < want.l.size());
    }
  }
}

TEST_CASE("cuda kernels (emulated): tiled prefill attention with a causal segment before others (unaligned tiles)") {
  // The call's own tokens first (causal): row j sees 2 + j of them, so the parents after them start at a
  // different key per row, and a split that starts inside a parent gives each row tiles at its own offsets
  // (the kernel's global-memory path there); splits that start before the parents keep the shared tiles.
  const HeadShape s{9, 3, 64};
  const int n = kTiledRows + 3;
  const Group g{n, {{{8, 9}, n + 1, 0, 1}, {{0, 1, 2, 3, 4}, 70, 0, -1}, {{5, 6, 7}, 45, -4, -1}}};
  for (auto [k_type, v_type] : {std::pair{DType::F32, DType::F32}, {DType::Q8_0, DType::F16}}) {
    const Pool pool(s, k_type, v_type, 10);
    const std::vector<float> q = random_values(size_t(n + 3) * s.n_heads * s.head_dim, 21);
    for (int split_tokens : {64, 256}) {
      CAPTURE(split_tokens);
      const auto [want, got] = run(pool, s, {g, prefill(3, 0)}, q, split_tokens);
      CHECK(same_bits(want, got));
    }
  }
}

TEST_CASE("cuda kernels (emulated): the tiled attention kernel's block table") {
  const std::vector<kernels::AttnGroup> groups = {
      {0, 1, 0, 0}, {1, 1 + kTiledRows + 1, 0, 0}, {10, 10, 0, 0}, {10, 10 + 2 * kTiledRows + 3, 0, 0}};
  const std::vector<kernels::AttnTiledBlock> blocks = kernels::tiled_blocks(groups.data(), int(groups.size()));
  std::vector<std::pair<int, int>> got;
  for (const kernels::AttnTiledBlock& b : blocks) got.emplace_back(b.group, b.first_row);
  const std::vector<std::pair<int, int>> want = {
      {0, 0}, {1, 1}, {1, 1 + kTiledRows}, {3, 10}, {3, 10 + kTiledRows}, {3, 10 + 2 * kTiledRows}};
  CHECK(got == want);
  // Usable in constant expressions (a launch geometry computed at compile time).
  static constexpr kernels::AttnGroup two[] = {{0, 5, 0, 0}, {5, 5 + 2 * kTiledRows, 0, 0}};
  static_assert(kernels::tiled_blocks(two, 2, nullptr) == 3);
  static_assert(kernels::tiled_shared_bytes(256) <= 227 * 1024);
}

}  // namespace
}  // namespace choreo::cuda
