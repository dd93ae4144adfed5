// Segment attention against a float64 brute-force reference written here from the definition:
// softmax(q · R(delta) k / sqrt(d)) V over exactly the visible tokens of each segment. Through the Backend
// interface (pages allocated, written and read back by it), on every backend of
// testing::conformance_backends(): the CPU's and the CUDA kernels in the block emulator.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using kernels::KvLayout;
using kernels::KvSegment;
using kernels::RopeParams;

/// Rotates a head vector by `pos` in float64 (both pair layouts).
void rotate64(std::vector<double>& h, double pos, const RopeParams& p) {
  int half = p.n_dims / 2;
  for (int i = 0; i < half; ++i) {
    double inv = std::pow(double(p.freq_base), -2.0 * i / p.n_dims);
    if (p.freq_factors) inv /= p.freq_factors[i];
    double c = std::cos(pos * inv), s = std::sin(pos * inv);
    int a = p.layout == RopeParams::Layout::Interleaved ? 2 * i : i;
    int b = p.layout == RopeParams::Layout::Interleaved ? 2 * i + 1 : i + half;
    double x0 = h[a], x1 = h[b];
    h[a] = x0 * c - x1 * s;
    h[b] = x0 * s + x1 * c;
  }
}

struct Shape {
  int page_tokens = 8, head_dim = 32, n_heads = 6, n_kv_heads = 2, n_q = 5;
};

/// Attention over three segments against a float64 brute force; returns the output.
std::vector<float> run_case(kernels::Backend& be, RopeParams::Layout layout, bool with_factors, uint32_t seed,
                            kernels::DType k_type = kernels::DType::F32, kernels::DType v_type = kernels::DType::F32,
                            Shape shape = {}) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n_layers = 2, layer = 1, n_kv_heads = shape.n_kv_heads, n_heads = shape.n_heads,
            head_dim = shape.head_dim;
  KvLayout kv{shape.page_tokens, n_layers, n_kv_heads, head_dim, k_type, v_type};
  kv.check();
  std::vector<float> factors(head_dim / 2);
  for (auto& f : factors) f = 1.0f + std::abs(normal(rng));
  RopeParams rope{layout, head_dim, 10000.0f, with_factors ? factors.data() : nullptr};
  REQUIRE(be.supports_kv(kv));

  // Three segments: two cached messages at arbitrary shifts (incl. negative, overlapping) and the call's own
  // causal tokens. Pages are the backend's; every slot of every layer gets random keys and values through
  // store_kv (in the layout's types), and the reference reads back what the pages hold.
  struct SegSpec { int n_tokens, delta, causal_base; };
  const int n_q = shape.n_q;
  std::vector<SegSpec> specs = {{11, 7, -1}, {70, -3, -1}, {4 + n_q, 40, 4}};  // own: 4 earlier tokens + n_q new
  std::vector<std::vector<kernels::PageId>> seg_pages(specs.size());
  std::vector<std::vector<std::vector<std::byte>>> host(specs.size());  // page images, read back
  std::vector<float> k_rows(size_t(kv.page_tokens) * kv.kv_dim()), v_rows(k_rows.size());
  for (size_t s = 0; s < specs.size(); ++s) {
    int n_pages = (specs[s].n_tokens + kv.page_tokens - 1) / kv.page_tokens;
    for (int p = 0; p < n_pages; ++p) {
      const kernels::PageId page = be.alloc_page(kv.page_bytes());
      seg_pages[s].push_back(page);
      const std::vector<kernels::PageId> ids(kv.page_tokens, page);
      std::vector<int32_t> slots(kv.page_tokens);
      for (int t = 0; t < kv.page_tokens; ++t) slots[t] = t;
      for (int l = 0; l < n_layers; ++l) {
        for (float& x : k_rows) x = normal(rng);
        for (float& x : v_rows) x = normal(rng);
        const kernels::Buffer<float> k_on(be, k_rows), v_on(be, v_rows);  // the backend's memory
        be.store_kv(kv, l, ids, slots, k_on.data(), v_on.data());
      }
      host[s].emplace_back(kv.page_bytes());
      be.copy_to_host(page, {0, kv.page_bytes()}, host[s].back().data()).wait();
    }
  }
  std::vector<KvSegment> segs;
  for (size_t s = 0; s < specs.size(); ++s)
    segs.push_back({seg_pages[s], specs[s].n_tokens, specs[s].delta, specs[s].causal_base});
  kernels::AttentionGroup group{0, n_q, segs};

  std::vector<float> q(size_t(n_q) * n_heads * head_dim), out(q.size());
  for (float& x : q) x = normal(rng);
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const kernels::Buffer<float> q_on(be, q), out_on(be, out.size());
  be.attention(layer, q_on.data(), n_q, n_heads, kv, std::span(&group, 1), rope, scale, out_on.data());
  out_on.download(out);

  double worst = 0.0;
  for (int j = 0; j < n_q; ++j)
    for (int h = 0; h < n_heads; ++h) {
      int kvh = h / (n_heads / n_kv_heads);
      std::vector<double> scores;
      std::vector<std::vector<double>> values;
      for (size_t s = 0; s < specs.size(); ++s) {
        int visible = specs[s].causal_base >= 0 ? specs[s].causal_base + j + 1 : specs[s].n_tokens;
        for (int t = 0; t < visible; ++t) {
          const std::byte* page = host[s][t / kv.page_tokens].data();
          int slot = t % kv.page_tokens;
          std::vector<double> k(head_dim), v(head_dim);
          std::vector<float> k_row(kv.kv_dim()), v_row(kv.kv_dim());
          kv.read_k(page, layer, slot, k_row.data());
          kv.read_v(page, layer, slot, v_row.data());
          for (int d = 0; d < head_dim; ++d) {
            k[d] = k_row[kvh * head_dim + d];
            v[d] = v_row[kvh * head_dim + d];
          }
          rotate64(k, specs[s].delta, rope);  // the key as if it had been encoded delta positions later
          double dot = 0.0;
          for (int d = 0; d < head_dim; ++d) dot += double(q[(size_t(j) * n_heads + h) * head_dim + d]) * k[d];
          scores.push_back(dot * scale);
          values.push_back(v);
        }
      }
      double mx = *std::max_element(scores.begin(), scores.end()), total = 0.0;
      for (double& s : scores) total += (s = std::exp(s - mx));
      for (int d = 0; d < head_dim; ++d) {
        double ref = 0.0;
        for (size_t t = 0; t < scores.size(); ++t) ref += scores[t] / total * values[t][d];
        double got = out[(size_t(j) * n_heads + h) * head_dim + d];
        worst = std::max(worst, std::abs(got - ref));
      }
    }
  CHECK(worst < 1e-4);
  for (const auto& pages : seg_pages)
    for (kernels::PageId page : pages) be.free_page(page);
  return out;
}

TEST_CASE("segment attention with shifts, gaps, overlaps and a causal own segment equals float64 brute force") {
  // Every backend (testing::conformance_backends). On the CPU: one thread (whole tiles) and two (few tiles, so
  // each is split over its pages and merged).
  kernels::cpu::ThreadPool& pool = kernels::cpu::kernel_pool();
  const int threads_before = pool.threads();
  for (const testing::NamedBackend& b : testing::conformance_backends()) {
    CAPTURE(b.name);
    for (int threads : {1, 2}) {
      pool.set_threads(threads);
      for (uint32_t seed = 1; seed <= 4; ++seed) {
        run_case(b.backend, RopeParams::Layout::Interleaved, false, seed);
        run_case(b.backend, RopeParams::Layout::Halves, false, seed);
        run_case(b.backend, RopeParams::Layout::Interleaved, true, seed);
        // The cache types: attention over what f16 / q8_0 pages hold, against the same reference.
        run_case(b.backend, RopeParams::Layout::Interleaved, false, seed, kernels::DType::F16, kernels::DType::F16);
        run_case(b.backend, RopeParams::Layout::Halves, true, seed, kernels::DType::Q8_0, kernels::DType::Q8_0);
        run_case(b.backend, RopeParams::Layout::Interleaved, false, seed, kernels::DType::Q8_0, kernels::DType::F16);
      }
    }
  }
  pool.set_threads(threads_before);
}

TEST_CASE("attention at every SIMD level gives the same bits, for every cache type, on the shapes the AVX-512 code takes") {
  using kernels::cpu::SimdLevel;
  struct Restore {
    ~Restore() { kernels::cpu::set_simd_level(kernels::cpu::detected_simd_level()); }
  } restore;
  // Without AVX-512 there is one SIMD level to run and nothing to compare its bits with: say so, rather than
  // pass having compared nothing (issue 42, finding 14).
  if (kernels::cpu::detected_simd_level() < SimdLevel::Avx512) {
    MESSAGE("SKIPPED: this CPU's SIMD level is ",
            kernels::cpu::simd_level_name(kernels::cpu::detected_simd_level()),
            ", without AVX-512, so there is no second level to compare AVX2's bits with");
    return;
  }
  kernels::cpu::ThreadPool& pool = kernels::cpu::kernel_pool();
  const int threads_before = pool.threads();
  size_t n_compared = 0;
  // SmolLM2's heads (64 dims, 3 query heads per KV head) and Llama-3.2-1B's (64, 4), a 128-dim head, pages of
  // 32 and 16 tokens (the AVX-512 score blocks need a multiple of 16) and of 8 (they fall back); 1 query row
  // (decode) to 21 (prefill: more than one 16-row tile).
  const Shape shapes[] = {{32, 64, 9, 3, 1}, {32, 64, 8, 2, 21}, {16, 128, 4, 2, 3}, {8, 64, 6, 2, 5},
                          {32, 128, 8, 1, 17}};
  for (const Shape& shape : shapes) {
    for (int threads : {1, 2}) {
      pool.set_threads(threads);
      std::vector<std::vector<float>> outs;
      for (SimdLevel level : {SimdLevel::Avx2, SimdLevel::Avx512}) {
        kernels::cpu::set_simd_level(level);
        for (auto [k_type, v_type] : {std::pair{kernels::DType::F32, kernels::DType::F32},
                                      std::pair{kernels::DType::F16, kernels::DType::F16},
                                      std::pair{kernels::DType::Q8_0, kernels::DType::Q8_0},
                                      std::pair{kernels::DType::Q8_0, kernels::DType::F16}}) {
          const std::vector<float> out = run_case(testing::cpu_backend(), RopeParams::Layout::Halves, false, 11, k_type, v_type, shape);
          outs.push_back(out);
        }
      }
      // Four cache-type combinations per level: output i of one level against output i of the other.
      REQUIRE(outs.size() == 8);
      for (size_t i = 4; i < outs.size(); ++i) {
        CHECK_MESSAGE(std::memcmp(outs[i - 4].data(), outs[i].data(), outs[i].size() * sizeof(float)) == 0,
                      "head_dim ", shape.head_dim, " page_tokens ", shape.page_tokens, " n_q ", shape.n_q, " types ", i % 4);
        ++n_compared;
      }
    }
  }
  pool.set_threads(threads_before);
  CHECK(n_compared == std::size(shapes) * 2 * 4);  // every shape, both thread counts, four cache types
}

}  // namespace
}  // namespace choreo
