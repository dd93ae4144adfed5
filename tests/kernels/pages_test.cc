// KV pages through the Backend interface (allocation, K/V stores in each cache type, layer-addressed
// asynchronous copies, one page at a time and batched), checked against values computed here: the compiler's
// own binary16 conversion for f16, the q8_0 rounding bound for q8_0, and byte comparison of host images for
// the copies (a batched copy holds the bytes of the per-page copies). Written against
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

/// Batched copies (copy_pages_to_host / copy_pages_from_host) against the per-page copies, on pages of two
/// layouts: f32 (whole pages and layer ranges in 16-byte words on the CUDA backend) and q8_0 keys with f16
/// values on 3-token pages (588-byte pages; layer ranges of 102 and 192 bytes at 2-byte boundaries), plus
/// ranges that start or end off any word boundary.
struct BatchCase {
  KvLayout kv;
  std::vector<ByteRange> ranges;
};
std::vector<BatchCase> batch_cases() {
  const KvLayout f32 = layout(DType::F32, DType::F32), odd{3, 2, 1, 32, DType::Q8_0, DType::F16};
  return {{f32, {{0, f32.page_bytes()}, f32.layer_k(1), f32.layer_v(2), {4, 36}, {1, 37}}},
          {odd, {{0, odd.page_bytes()}, odd.layer_k(1), odd.layer_v(0), {3, 1}, {odd.page_bytes() - 5, 5}}}};
}

/// Random bytes, seeded.
std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = std::byte(rng() & 0xff);
  return out;
}

/// n pages of `bytes`, each filled with its random image by a per-page copy as soon as it is allocated (so
/// that on the CUDA backend they span the arena's growths: 16 pages, then doubling), in a shuffled order.
struct Filled {
  std::vector<PageId> pages;
  std::vector<std::vector<std::byte>> images;  // by position in `pages`
};
Filled filled_pages(kernels::Backend& be, size_t n, size_t bytes, uint32_t seed) {
  Filled f;
  for (size_t i = 0; i < n; ++i) {
    f.pages.push_back(be.alloc_page(bytes));
    f.images.push_back(random_bytes(bytes, seed + uint32_t(i)));
    be.copy_from_host(f.images.back().data(), f.pages.back(), {0, bytes}).wait();
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  Filled shuffled;
  for (size_t i : order) {
    shuffled.pages.push_back(f.pages[i]);
    shuffled.images.push_back(std::move(f.images[i]));
  }
  return shuffled;
}

/// The range of each page, piece after piece, by one copy_to_host per page.
std::vector<std::byte> per_page_download(kernels::Backend& be, std::span<const PageId> pages, ByteRange r) {
  std::vector<std::byte> out(pages.size() * r.bytes);
  std::vector<kernels::Completion> done;
  for (size_t i = 0; i < pages.size(); ++i) done.push_back(be.copy_to_host(pages[i], r, out.data() + i * r.bytes));
  for (const kernels::Completion& c : done) c.wait();
  return out;
}

TEST_CASE("pages: a batched copy to host holds the per-page copies' bytes, for 1 to 70 pages, whole or in ranges") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    for (const BatchCase& c : batch_cases()) {
      const Filled f = filled_pages(be, 70, c.kv.page_bytes(), 21);
      for (size_t n : {size_t(1), size_t(2), size_t(17), size_t(70)})
        for (const ByteRange r : c.ranges) {
          CAPTURE(n);
          CAPTURE(r.offset);
          CAPTURE(r.bytes);
          const std::span<const PageId> pages = std::span(f.pages).first(n);
          std::vector<std::byte> got(n * r.bytes, std::byte(0x5a));
          be.copy_pages_to_host(pages, r, got.data()).wait();
          CHECK(got == per_page_download(be, pages, r));
          bool as_written = true;  // and the bytes the pages were given (the per-page copies are not vacuous)
          for (size_t i = 0; i < n; ++i)
            as_written &= std::memcmp(got.data() + i * r.bytes, f.images[i].data() + r.offset, r.bytes) == 0;
          CHECK(as_written);
        }
      for (PageId p : f.pages) be.free_page(p);
    }
  }
}

TEST_CASE("pages: a batched copy from host writes what per-page copies write, and a round trip restores the pages") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    for (const BatchCase& c : batch_cases()) {
      const size_t bytes = c.kv.page_bytes();
      for (size_t n : {size_t(1), size_t(70)})
        for (const ByteRange r : c.ranges) {
          CAPTURE(n);
          CAPTURE(r.offset);
          CAPTURE(r.bytes);
          // Two sets of pages with the same images: one written per page, the other by one batched copy.
          const Filled batched = filled_pages(be, n, bytes, 40), per_page = filled_pages(be, n, bytes, 40);
          const std::vector<std::byte> src = random_bytes(n * r.bytes, 41);
          be.copy_pages_from_host(src.data(), batched.pages, r).wait();
          for (size_t i = 0; i < n; ++i) be.copy_from_host(src.data() + i * r.bytes, per_page.pages[i], r).wait();
          const std::vector<std::byte> got = per_page_download(be, batched.pages, {0, bytes}),
                                       want = per_page_download(be, per_page.pages, {0, bytes});
          CHECK(got == want);
          bool as_written = true;  // the range from src, the rest of each page as it was
          for (size_t i = 0; i < n; ++i) {
            std::vector<std::byte> page = batched.images[i];
            std::copy_n(src.begin() + long(i * r.bytes), r.bytes, page.begin() + long(r.offset));
            as_written &= std::memcmp(got.data() + i * bytes, page.data(), bytes) == 0;
          }
          CHECK(as_written);
          // Down and up again, over pages overwritten in between: every page as it was, bit for bit.
          std::vector<std::byte> saved(n * bytes);
          be.copy_pages_to_host(batched.pages, {0, bytes}, saved.data()).wait();
          const std::vector<std::byte> zeros(n * bytes);
          be.copy_pages_from_host(zeros.data(), batched.pages, {0, bytes}).wait();
          CHECK(per_page_download(be, batched.pages, {0, bytes}) == zeros);
          be.copy_pages_from_host(saved.data(), batched.pages, {0, bytes}).wait();
          CHECK(per_page_download(be, batched.pages, {0, bytes}) == got);
          for (const Filled* f : {&batched, &per_page})
            for (PageId p : f->pages) be.free_page(p);
        }
    }
  }
}

TEST_CASE("pages: a batched copy may mix page sizes, and leaves the bytes around its range alone") {
  // Pages of two sizes alternate in one list (two arenas on the CUDA backend); the range fits the smaller.
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    const Filled small = filled_pages(be, 5, 588, 50), large = filled_pages(be, 5, 12288, 60);
    std::vector<PageId> mixed;
    std::vector<const std::vector<std::byte>*> images;
    for (size_t i = 0; i < 5; ++i) {
      mixed.insert(mixed.end(), {small.pages[i], large.pages[i]});
      images.insert(images.end(), {&small.images[i], &large.images[i]});
    }
    const ByteRange r{100, 400};
    std::vector<std::byte> got(mixed.size() * r.bytes);
    be.copy_pages_to_host(mixed, r, got.data()).wait();
    CHECK(got == per_page_download(be, mixed, r));
    const std::vector<std::byte> src = random_bytes(got.size(), 61);
    be.copy_pages_from_host(src.data(), mixed, r).wait();
    for (size_t i = 0; i < mixed.size(); ++i) {
      CAPTURE(i);
      std::vector<std::byte> want = *images[i];
      std::copy_n(src.begin() + long(i * r.bytes), r.bytes, want.begin() + long(r.offset));
      CHECK(per_page_download(be, std::span(&mixed[i], 1), {0, want.size()}) == want);
    }
    for (PageId p : mixed) be.free_page(p);
  }
}

TEST_CASE("pages: batched copies check every page and the range before copying, and an empty list is done at once") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    kernels::Backend& be = backend.backend;
    CAPTURE(backend.name);
    const size_t bytes = 588;
    const Filled f = filled_pages(be, 3, bytes, 70);
    const kernels::Completion none_down = be.copy_pages_to_host({}, {0, bytes}, nullptr),
                              none_up = be.copy_pages_from_host(nullptr, {}, {0, bytes});
    CHECK(none_down.ready());
    CHECK(none_up.ready());
    CHECK_NOTHROW(none_down.wait());
    CHECK_NOTHROW(none_up.wait());

    const std::vector<PageId> unknown = {f.pages[0], PageId(0x7fffffff), f.pages[1]};
    std::vector<std::byte> host(3 * bytes, std::byte(0x5a));
    const std::vector<std::byte> untouched = host;
    CHECK_THROWS_AS(be.copy_pages_to_host(unknown, {0, bytes}, host.data()), std::out_of_range);
    CHECK_THROWS_AS(be.copy_pages_to_host(f.pages, {0, bytes + 1}, host.data()), std::out_of_range);
    CHECK_THROWS_AS(be.copy_pages_to_host(f.pages, {bytes + 1, 0}, host.data()), std::out_of_range);
    CHECK_THROWS_AS(be.copy_pages_to_host(f.pages, {1, bytes}, host.data()), std::out_of_range);
    CHECK(host == untouched);  // nothing copied: no page was written to the host buffer before the bad one
    CHECK_THROWS_AS(be.copy_pages_from_host(host.data(), unknown, {0, bytes}), std::out_of_range);
    CHECK_THROWS_AS(be.copy_pages_from_host(host.data(), f.pages, {8, bytes}), std::out_of_range);
    // A page listed twice: read twice when copied out, refused when copied in (which copy would win?).
    const std::vector<PageId> twice = {f.pages[2], f.pages[0], f.pages[2]};
    be.copy_pages_to_host(twice, {0, bytes}, host.data()).wait();
    CHECK(std::memcmp(host.data(), host.data() + 2 * bytes, bytes) == 0);
    CHECK(std::memcmp(host.data(), f.images[2].data(), bytes) == 0);
    CHECK_THROWS_AS(be.copy_pages_from_host(untouched.data(), twice, {0, bytes}), std::invalid_argument);
    for (size_t i = 0; i < f.pages.size(); ++i)  // no page was written by a refused copy
      CHECK(per_page_download(be, std::span(&f.pages[i], 1), {0, bytes}) == f.images[i]);
    for (PageId p : f.pages) be.free_page(p);
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
