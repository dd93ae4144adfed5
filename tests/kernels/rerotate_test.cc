// Key re-rotation (Backend::rerotate_keys), written against kernels::Backend and run on every backend of
// testing::conformance_backends(): its pages are, byte for byte, what the engine's former path made of them
// (every key row downloaded, rotated alone by Backend::rope and stored again), in place and into a copy, and
// its keys are a float64 rotation of the stored keys within the rounding of the cache type.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/backend.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using kernels::DType;
using kernels::KvLayout;
using kernels::PageId;
using kernels::RopeParams;

constexpr int kTokens = 19;  // over 3 pages of 8: the last page has slots past the tokens

std::vector<std::byte> images(kernels::Backend& be, const KvLayout& kv, std::span<const PageId> pages) {
  std::vector<std::byte> out(pages.size() * kv.page_bytes());
  be.copy_pages_to_host(pages, {0, kv.page_bytes()}, out.data()).wait();
  return out;
}

/// Pages whose every slot holds normal(0, 2) keys and values, encoded by KvLayout::write_k / write_v.
std::vector<PageId> filled_pages(kernels::Backend& be, const KvLayout& kv, int n_pages, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::byte> host(size_t(n_pages) * kv.page_bytes());
  std::vector<float> row(size_t(kv.kv_dim()));
  for (int p = 0; p < n_pages; ++p)
    for (int l = 0; l < kv.n_layers; ++l)
      for (int slot = 0; slot < kv.page_tokens; ++slot) {
        std::byte* page = host.data() + size_t(p) * kv.page_bytes();
        for (float& x : row) x = normal(rng);
        kv.write_k(page, l, slot, row.data());
        for (float& x : row) x = normal(rng);
        kv.write_v(page, l, slot, row.data());
      }
  std::vector<PageId> pages;
  for (int p = 0; p < n_pages; ++p) pages.push_back(be.alloc_page(kv.page_bytes()));
  be.copy_pages_from_host(host.data(), pages, {0, kv.page_bytes()}).wait();
  return pages;
}

/// The engine's former re-rotation: the pages downloaded, every key row of the first n_tokens tokens
/// uploaded, rotated alone by Backend::rope at position delta, downloaded and stored again.
std::vector<std::byte> row_by_row(kernels::Backend& be, const KvLayout& kv, std::span<const PageId> pages,
                                  int n_tokens, int delta, const RopeParams& rope) {
  std::vector<std::byte> host = images(be, kv, pages);
  std::vector<float> row(size_t(kv.kv_dim()));
  kernels::Buffer<float> on_backend(be, row.size());
  for (int t = 0; t < n_tokens; ++t) {
    std::byte* page = host.data() + size_t(t / kv.page_tokens) * kv.page_bytes();
    for (int l = 0; l < kv.n_layers; ++l) {
      kv.read_k(page, l, t % kv.page_tokens, row.data());
      on_backend.upload(row);
      be.rope(on_backend.data(), 1, kv.n_kv_heads, kv.head_dim, &delta, rope);
      on_backend.download(row);
      kv.write_k(page, l, t % kv.page_tokens, row.data());
    }
  }
  return host;
}

/// One key row rotated by delta in float64: pairs (2i, 2i+1) or (i, i + n_dims/2) of each head, angle
/// delta · base^(-2i/n_dims) / factor_i; dimensions past n_dims unchanged.
std::vector<double> rotated_f64(std::span<const float> row, const KvLayout& kv, int delta, const RopeParams& rope) {
  std::vector<double> out(row.begin(), row.end());
  const int half = rope.n_dims / 2;
  for (int h = 0; h < kv.n_kv_heads; ++h)
    for (int i = 0; i < half; ++i) {
      double inv_freq = std::pow(double(rope.freq_base), -2.0 * i / rope.n_dims);
      if (rope.freq_factors) inv_freq /= rope.freq_factors[i];
      const double theta = double(delta) * inv_freq;
      const int a = h * kv.head_dim + (rope.layout == RopeParams::Layout::Interleaved ? 2 * i : i);
      const int b = rope.layout == RopeParams::Layout::Interleaved ? a + 1 : a + half;
      const double x0 = row[size_t(a)], x1 = row[size_t(b)];
      out[size_t(a)] = x0 * std::cos(theta) - x1 * std::sin(theta);
      out[size_t(b)] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  return out;
}

/// The worst error of stored keys against their float64 rotation, in units of what the type allows: a float
/// rotation (cos and sin rounded to float, two products and a sum: within 1e-6 of the pair's magnitude), then
/// the type's rounding (f16: half an ulp, 2^-11 relative; q8_0: half a step of the block's scale, plus its
/// fp16 rounding, 127 · 2^-11 steps). Above 1 is a failure.
double worst_error(DType type, std::span<const double> want, std::span<const float> got) {
  double worst = 0.0, magnitude = 0.0;
  for (double w : want) magnitude = std::max(magnitude, std::abs(w));
  const double rotation = 1e-6 * magnitude;
  for (size_t b = 0; b < want.size(); b += 32) {
    double amax = 0.0;
    for (size_t i = b; i < b + 32 && i < want.size(); ++i) amax = std::max(amax, std::abs(want[i]));
    for (size_t i = b; i < b + 32 && i < want.size(); ++i) {
      double allowed = rotation;
      if (type == DType::F16) allowed += (std::abs(want[i]) + rotation) / 2048.0;
      if (type == DType::Q8_0) allowed += (0.5 + 127.0 / 2048.0) * (amax + rotation) / 127.0;
      worst = std::max(worst, std::abs(double(got[i]) - want[i]) / allowed);
    }
  }
  return worst;
}

struct RopeCase {
  const char* name;
  RopeParams params;
};

TEST_CASE("key re-rotation: the bits of rotating each key row alone with rope, in place and into a copy, and a "
          "float64 rotation within the cache type's rounding, on every backend") {
  static const std::vector<float> llama3_factors = [] {
    std::vector<float> f(16);
    for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + 0.5f * float(i);
    return f;
  }();
  const std::vector<RopeCase> ropes = {
      {"interleaved, Llama-3 factors", {RopeParams::Layout::Interleaved, 32, 500000.0f, llama3_factors.data()}},
      {"halves, 16 of 32 dimensions", {RopeParams::Layout::Halves, 16, 10000.0f, nullptr}}};
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    const std::string backend_name = backend.name;
    CAPTURE(backend_name);
    for (auto [kt, vt] : {std::pair{DType::F32, DType::F32}, {DType::F16, DType::F16}, {DType::Q8_0, DType::Q8_0},
                          {DType::Q8_0, DType::F32}}) {
      const KvLayout kv{8, 3, 2, 32, kt, vt};
      CAPTURE(int(kt));
      CAPTURE(int(vt));
      for (const RopeCase& rope : ropes)
        for (int delta : {37, -5, 4000}) {
          const std::string rope_name = rope.name;
          CAPTURE(rope_name);
          CAPTURE(delta);
          const std::vector<PageId> from = filled_pages(be, kv, 3, uint32_t(delta + 100 * int(kt)));
          const std::vector<std::byte> before = images(be, kv, from);
          const std::vector<std::byte> want = row_by_row(be, kv, from, kTokens, delta, rope.params);

          // Into a copy: the copy holds the row-by-row bytes, every one of them; the source is untouched.
          std::vector<PageId> to;
          for (size_t i = 0; i < from.size(); ++i) to.push_back(be.alloc_page(kv.page_bytes()));
          be.rerotate_keys(kv, from, to, kTokens, delta, rope.params);
          const std::vector<std::byte> copied = images(be, kv, to);
          CHECK(copied == want);
          CHECK(images(be, kv, from) == before);
          // In place: the same bytes.
          be.rerotate_keys(kv, from, from, kTokens, delta, rope.params);
          CHECK(images(be, kv, from) == want);

          // Against float64: every token's keys, every layer.
          double worst = 0.0, moved = 0.0;
          std::vector<float> original(size_t(kv.kv_dim())), got(original.size());
          for (int t = 0; t < kTokens; ++t)
            for (int l = 0; l < kv.n_layers; ++l) {
              const size_t page = size_t(t / kv.page_tokens) * kv.page_bytes();
              kv.read_k(before.data() + page, l, t % kv.page_tokens, original.data());
              kv.read_k(copied.data() + page, l, t % kv.page_tokens, got.data());
              worst = std::max(worst, worst_error(kt, rotated_f64(original, kv, delta, rope.params), got));
              for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, double(std::abs(got[i] - original[i])));
            }
          CHECK(worst <= 1.0);
          CHECK(moved > 1e-2);  // not vacuous: the keys did turn
          for (PageId p : from) be.free_page(p);
          for (PageId p : to) be.free_page(p);
        }
    }
  }
}

TEST_CASE("key re-rotation: lists that do not match, too many tokens, and a page written while another reads it "
          "are refused before anything is written, on every backend") {
  const RopeParams rope{RopeParams::Layout::Interleaved, 32, 10000.0f, nullptr};
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    const std::string backend_name = backend.name;
    CAPTURE(backend_name);
    const KvLayout kv{8, 2, 1, 32, DType::F32, DType::F32};
    const std::vector<PageId> from = filled_pages(be, kv, 2, 9);
    const std::vector<PageId> spare = {be.alloc_page(kv.page_bytes()), be.alloc_page(kv.page_bytes())};
    const std::vector<std::byte> before = images(be, kv, from), spare_before = images(be, kv, spare);
    CHECK_THROWS_AS(be.rerotate_keys(kv, from, std::span(spare).first(1), 8, 3, rope), std::invalid_argument);
    CHECK_THROWS_AS(be.rerotate_keys(kv, from, spare, 17, 3, rope), std::invalid_argument);
    CHECK_THROWS_AS(be.rerotate_keys(kv, from, spare, -1, 3, rope), std::invalid_argument);
    CHECK_THROWS_AS(be.rerotate_keys(kv, from, std::vector<PageId>{spare[0], spare[0]}, 16, 3, rope),
                    std::invalid_argument);
    // to[1] is from[0]: token 8's keys would be written where token 0's are still to be read.
    CHECK_THROWS_AS(be.rerotate_keys(kv, from, std::vector<PageId>{spare[0], from[0]}, 16, 3, rope),
                    std::invalid_argument);
    CHECK(images(be, kv, from) == before);
    CHECK(images(be, kv, spare) == spare_before);
    // The control: the same lists, valid, are accepted; no tokens copies the pages and rotates nothing.
    be.rerotate_keys(kv, from, spare, 0, 3, rope);
    CHECK(images(be, kv, spare) == before);
    for (PageId p : from) be.free_page(p);
    for (PageId p : spare) be.free_page(p);
  }
}

}  // namespace
}  // namespace choreo
