// KV pages through the Backend interface (allocation, K/V stores in each cache type, layer-addressed
// asynchronous copies), checked against values computed here: the compiler's own binary16 conversion for
// f16, the q8_0 rounding bound for q8_0, and byte comparison of host images for the copies. Written against
// kernels::Backend only, and run on every backend of testing::conformance_backends() (the CPU's, and the CUDA
// kernels in the block emulator, which store f32 pages only).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include <doctest/doctest.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using kernels::ByteRange;
using kernels::DType;
using kernels::KvLayout;
using kernels::PageId;

KvLayout layout(DType k, DType v) { return KvLayout{8, 3, 2, 32, k, v}; }

std::vector<std::byte> host_image(kernels::Backend& be, PageId page, size_t bytes) {
  std::vector<std::byte> out(bytes);
  be.copy_to_host(page, {0, bytes}, out.data()).wait();
  return out;
}

/// Every slot of every layer filled with normal(0, 2) keys and values through store_kv; returns them,
/// [layer][slot][kv_dim] for K then the same for V.
std::pair<std::vector<float>, std::vector<float>> fill(kernels::Backend& be, const KvLayout& kv, PageId page,
                                                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const size_t per_layer = size_t(kv.page_tokens) * kv.kv_dim();
  std::vector<float> k(per_layer * kv.n_layers), v(k.size());
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  // Two stores per layer (slots in reverse order, then split), so that slots and pages are really per row.
  std::vector<int32_t> slots(kv.page_tokens);
  for (int t = 0; t < kv.page_tokens; ++t) slots[t] = kv.page_tokens - 1 - t;
  std::vector<float> k_rev(per_layer), v_rev(per_layer);
  for (int l = 0; l < kv.n_layers; ++l) {
    for (int t = 0; t < kv.page_tokens; ++t) {
      std::copy_n(&k[l * per_layer + size_t(slots[t]) * kv.kv_dim()], kv.kv_dim(), &k_rev[size_t(t) * kv.kv_dim()]);
      std::copy_n(&v[l * per_layer + size_t(slots[t]) * kv.kv_dim()], kv.kv_dim(), &v_rev[size_t(t) * kv.kv_dim()]);
    }
    const std::vector<PageId> pages(kv.page_tokens, page);
    const size_t half = kv.page_tokens / 2;
    // The rows in the backend's memory, as store_kv takes them.
    const kernels::Buffer<float> k_on(be, k_rev), v_on(be, v_rev);
    be.store_kv(kv, l, std::span(pages).first(half), std::span(slots).first(half), k_on.data(), v_on.data());
    be.store_kv(kv, l, std::span(pages).subspan(half), std::span(slots).subspan(half),
                k_on.data() + half * kv.kv_dim(), v_on.data() + half * kv.kv_dim());
  }
  return {k, v};
}

/// What a stored value may be for x in each type: exact for f32, binary16 round-to-nearest for f16, and for
/// q8_0 within half a quantisation step of its block (step = the block's largest magnitude / 127), plus the
/// error of the step's fp16 rounding.
void check_stored(DType type, std::span<const float> want, std::span<const float> got) {
  REQUIRE(want.size() == got.size());
  if (type == DType::F32) {
    CHECK(std::memcmp(want.data(), got.data(), want.size_bytes()) == 0);
  } else if (type == DType::F16) {
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += float(_Float16(want[i])) != got[i];
    CHECK(bad == 0);
  } else {
    double worst = 0.0;
    for (size_t b = 0; b < want.size(); b += 32) {
      float amax = 0.0f;
      for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(want[i]));
      const double step = double(amax) / 127.0;
      for (size_t i = b; i < b + 32; ++i)
        worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / step);
    }
    // The scale is stored in fp16 (relative error <= 2^-11), which moves a value by up to 127 * 2^-11 steps.
    CHECK(worst <= 0.5 + 127.0 / 2048 + 1e-6);
  }
}

TEST_CASE("pages: store_kv writes every cache type as its definition says, read back through copies") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    for (auto [kt, vt] : {std::pair{DType::F32, DType::F32}, {DType::F16, DType::F16}, {DType::Q8_0, DType::Q8_0},
                          {DType::Q8_0, DType::F16}}) {
      CAPTURE(int(kt));
      CAPTURE(int(vt));
      const KvLayout kv = layout(kt, vt);
      if (!be.supports_kv(kv)) continue;  // refusal is checked in attention_test.cc
      const PageId page = be.alloc_page(kv.page_bytes());
      const auto [k, v] = fill(be, kv, page, 11);
      const std::vector<std::byte> image = host_image(be, page, kv.page_bytes());
      std::vector<float> k_got(k.size()), v_got(v.size());
      for (int l = 0; l < kv.n_layers; ++l)
        for (int t = 0; t < kv.page_tokens; ++t) {
          const size_t at = (size_t(l) * kv.page_tokens + t) * kv.kv_dim();
          kv.read_k(image.data(), l, t, &k_got[at]);
          kv.read_v(image.data(), l, t, &v_got[at]);
        }
      check_stored(kt, k, k_got);
      check_stored(vt, v, v_got);
      be.free_page(page);
    }
  }
}

TEST_CASE("pages: the K and V of each layer are ranges that tile the page, copied on their own") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    for (DType t : {DType::F32, DType::F16, DType::Q8_0}) {
      const KvLayout kv = layout(t, t);
      if (!be.supports_kv(kv)) continue;
      // The ranges cover every byte exactly once.
      std::vector<int> covered(kv.page_bytes(), 0);
      for (int l = 0; l < kv.n_layers; ++l)
        for (ByteRange r : {kv.layer_k(l), kv.layer_v(l)}) {
          REQUIRE(r.offset + r.bytes <= kv.page_bytes());
          for (size_t i = r.offset; i < r.offset + r.bytes; ++i) ++covered[i];
        }
      CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));

      const PageId a = be.alloc_page(kv.page_bytes()), b = be.alloc_page(kv.page_bytes());
      fill(be, kv, a, 3);
      fill(be, kv, b, 4);
      const std::vector<std::byte> image_a = host_image(be, a, kv.page_bytes());
      std::vector<std::byte> image_b = host_image(be, b, kv.page_bytes());
      // Layer 1's K and V, to host on their own: the same bytes as in the whole page.
      for (ByteRange r : {kv.layer_k(1), kv.layer_v(1)}) {
        std::vector<std::byte> part(r.bytes);
        be.copy_to_host(a, r, part.data()).wait();
        CHECK(std::memcmp(part.data(), image_a.data() + r.offset, r.bytes) == 0);
      }
      // Layer 2 of A into B, one range from host and one page to page: only those bytes of B change.
      const ByteRange k2 = kv.layer_k(2), v2 = kv.layer_v(2);
      be.copy_from_host(image_a.data() + k2.offset, b, k2).wait();
      be.copy_page(b, a, v2);
      std::copy_n(image_a.begin() + long(k2.offset), k2.bytes, image_b.begin() + long(k2.offset));
      std::copy_n(image_a.begin() + long(v2.offset), v2.bytes, image_b.begin() + long(v2.offset));
      CHECK(host_image(be, b, kv.page_bytes()) == image_b);
      be.free_page(a);
      be.free_page(b);
    }
  }
}

TEST_CASE("pages: new pages are zero, also when recycled, and copies run asynchronously and are checked") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    const KvLayout kv = layout(DType::F32, DType::F32);
    std::vector<PageId> pages;
    for (int i = 0; i < 6; ++i) pages.push_back(be.alloc_page(kv.page_bytes()));
    std::sort(pages.begin(), pages.end());
    CHECK(std::adjacent_find(pages.begin(), pages.end()) == pages.end());  // distinct ids
    // Many copies in flight at once, waited for afterwards.
    std::vector<std::vector<std::byte>> src(pages.size(), std::vector<std::byte>(kv.page_bytes()));
    std::vector<kernels::Completion> done;
    for (size_t i = 0; i < pages.size(); ++i) {
      std::fill(src[i].begin(), src[i].end(), std::byte(i + 1));
      done.push_back(be.copy_from_host(src[i].data(), pages[i], {0, kv.page_bytes()}));
    }
    for (const kernels::Completion& c : done) c.wait();
    for (size_t i = 0; i < pages.size(); ++i) CHECK(host_image(be, pages[i], kv.page_bytes()) == src[i]);
    // Freed and allocated again: the recycled pages come back zeroed.
    for (PageId p : pages) be.free_page(p);
    for (size_t i = 0; i < pages.size(); ++i) {
      const PageId p = be.alloc_page(kv.page_bytes());
      const std::vector<std::byte> image = host_image(be, p, kv.page_bytes());
      CHECK(std::all_of(image.begin(), image.end(), [](std::byte b) { return b == std::byte(0); }));
      pages[i] = p;
    }
    // A range outside the page is refused, not copied.
    std::vector<std::byte> big(kv.page_bytes() + 1);
    CHECK_THROWS_AS(be.copy_to_host(pages[0], {0, kv.page_bytes() + 1}, big.data()), std::out_of_range);
    CHECK_THROWS_AS(be.copy_from_host(big.data(), pages[0], {1, kv.page_bytes()}), std::out_of_range);
    for (PageId p : pages) be.free_page(p);
  }
}

TEST_CASE("pages: alloc_host memory is aligned host memory that page copies read and write, on every backend") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    const KvLayout kv = layout(DType::F16, DType::Q8_0);
    const size_t bytes = kv.page_bytes();
    auto* in = static_cast<std::byte*>(be.alloc_host(2 * bytes));
    auto* out = static_cast<std::byte*>(be.alloc_host(bytes));
    CHECK(reinterpret_cast<uintptr_t>(in) % 64 == 0);
    CHECK(reinterpret_cast<uintptr_t>(out) % 64 == 0);
    for (size_t b = 0; b < 2 * bytes; ++b) in[b] = std::byte((b * 11 + 5) & 0xff);  // the host reads and writes it
    const PageId page = be.alloc_page(bytes);
    be.copy_from_host(in + bytes, page, {0, bytes}).wait();  // from the middle of an allocation too
    be.copy_to_host(page, {0, bytes}, out).wait();
    CHECK(std::memcmp(out, in + bytes, bytes) == 0);
    CHECK(host_image(be, page, bytes) == std::vector<std::byte>(in + bytes, in + 2 * bytes));
    be.free_page(page);
    be.release_host(in);
    be.release_host(out);
  }
}

TEST_CASE("pages: every page keeps its bytes while the pool grows around it") {
  // The CUDA backend keeps the pages of one size in one allocation and moves them when it grows (16 pages,
  // then doubling): pages written before each growth must read back unchanged after it.
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    const KvLayout kv = layout(DType::Q8_0, DType::F16);
    std::vector<PageId> pages;
    std::vector<std::vector<std::byte>> images;
    for (int i = 0; i < 70; ++i) {
      pages.push_back(be.alloc_page(kv.page_bytes()));
      images.emplace_back(kv.page_bytes());
      for (size_t b = 0; b < images.back().size(); ++b) images.back()[b] = std::byte((b * 7 + size_t(i) * 13) & 0xff);
      be.copy_from_host(images.back().data(), pages.back(), {0, kv.page_bytes()}).wait();
      if (i % 10 == 0) be.free_page(be.alloc_page(kv.page_bytes()));  // a page freed on the way
    }
    for (size_t i = 0; i < pages.size(); ++i) {
      CAPTURE(i);
      CHECK(host_image(be, pages[i], kv.page_bytes()) == images[i]);
    }
    for (PageId p : pages) be.free_page(p);
  }
}

TEST_CASE("pages: cache types are named as llama.cpp's -ctk/-ctv, and checked against the model's heads") {
  CHECK(kernels::parse_kv_type("f32") == DType::F32);
  CHECK(kernels::parse_kv_type("f16") == DType::F16);
  CHECK(kernels::parse_kv_type("q8_0") == DType::Q8_0);
  CHECK_THROWS_AS(kernels::parse_kv_type("q4_0"), InputError);
  CHECK_THROWS_AS(kernels::parse_kv_type("F16"), InputError);
  KvLayout odd{8, 2, 2, 16, DType::Q8_0, DType::F32};  // 16-wide heads cannot hold 32-element blocks
  CHECK_THROWS_AS(odd.check(), InputError);
  odd.k_type = DType::F16;
  CHECK_NOTHROW(odd.check());
  // Page sizes: f16 halves f32, q8_0 is 34 bytes per 32 values.
  const KvLayout f32 = layout(DType::F32, DType::F32), f16 = layout(DType::F16, DType::F16),
                 q8 = layout(DType::Q8_0, DType::Q8_0);
  CHECK(f16.page_bytes() * 2 == f32.page_bytes());
  CHECK(q8.page_bytes() * 32 * 4 == f32.page_bytes() * 34);
}

}  // namespace
}  // namespace choreo
