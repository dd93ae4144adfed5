// The CUDA kernels as a whole backend (kernels::make_cuda_emulated_backend: every operation a kernel of
// kernels/cuda/kernels run by the block emulator, every launch checked for out-of-bounds accesses and races,
// except the products of F32, F16 and BF16 weights: those go to a CPU GEMM in cuBLAS's conventions,
// kernels/cuda/emu/blas_emulated.cc, where a GPU runs cuBLASLt, which only a GPU can check: device_test.cc):
// - the products, stories260K and the shipped head shapes (tests/cuda/backend_checks.h, which a CUDA device
//   runs too: tests/cuda/device_test.cc);
// - KV pages it writes in f32, f16 and q8_0 are byte for byte the CPU backend's;
// - an operation given memory that is not the backend's (Backend::alloc) is refused, as on a GPU;
// - what it cannot compute is refused with an InputError: weights in a format it has no kernel for.
// The master equivalence test, batch invariance and the llama.cpp comparison also run on it (engine_test.cc,
// batch_invariance_test.cc, llama_reference_test.cc); the page and attention conformance tests run on every
// backend (tests/kernels).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "runtime/model/synth.h"
#include "tests/cuda/backend_checks.h"
#include "tests/cuda/random_values.h"
#include "tests/cuda/session_logits.h"
#include "tests/cuda/stored_weight.h"
#include "tests/reference/reference.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using kernels::DType;
using kernels::KvLayout;
using testing::product;
using testing::random_values;
using testing::session_logits;
using testing::StoredWeight;
using testing::worst_relative;

kernels::Backend& emulated() { return *testing::stories260k_cuda_emulated().backend; }

TEST_CASE("cuda backend (emulated): the products are float64 products within rounding, in every weight format, and batch invariant") {
  testing::check_products(emulated(), 96, 37);  // outputs not a multiple of the 8 per block
}

TEST_CASE(
    "cuda backend (emulated): the emulated GEMM's F32, F16 and BF16 products are the CPU backend's within "
    "the rounding of their types") {
  // The check a GPU runs on cuBLASLt (device_test.cc), on the GEMM that stands in for it here.
  testing::check_products_against_cpu(emulated(), 96, 37, 5);
}

TEST_CASE("cuda backend (emulated): an F32 weight with padded rows gives the products of its packed rows, bit for bit") {
  kernels::Backend& be = emulated();
  const int n_in = 50, n_out = 9, pad = 14, n = 3;
  const std::vector<float> values = random_values(size_t(n_out) * size_t(n_in + pad), 8);
  kernels::Weight padded;
  padded.type = DType::F32;
  padded.data = values.data();
  padded.n_out = n_out;
  padded.n_in = n_in;
  padded.row_stride = sizeof(float) * size_t(n_in + pad);
  // The same rows packed.
  std::vector<float> packed_values;
  for (int o = 0; o < n_out; ++o)
    packed_values.insert(packed_values.end(), values.begin() + long(o) * (n_in + pad), values.begin() + long(o) * (n_in + pad) + n_in);
  kernels::Weight packed = padded;
  packed.data = packed_values.data();
  packed.row_stride = sizeof(float) * size_t(n_in);
  const std::vector<float> x = random_values(size_t(n) * n_in, 9);
  const std::vector<float> y_padded = product(be, be.upload_weight(padded), x.data(), n);
  const std::vector<float> y_packed = product(be, be.upload_weight(packed), x.data(), n);
  CHECK(std::memcmp(y_padded.data(), y_packed.data(), sizeof(float) * y_packed.size()) == 0);
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < n_out; ++o) {
      double want = 0;
      for (int k = 0; k < n_in; ++k) want += double(packed_values[size_t(o) * n_in + k]) * double(x[size_t(r) * n_in + k]);
      CHECK(y_packed[size_t(r) * n_out + o] == doctest::Approx(want).epsilon(1e-5));
    }
}

TEST_CASE("cuda backend (emulated): weights without a kernel are input errors") {
  kernels::Backend& be = emulated();
  kernels::Weight q6k;
  q6k.type = DType::Q6_K;
  q6k.n_out = 4;
  q6k.n_in = 256;
  q6k.row_stride = kernels::row_bytes(DType::Q6_K, 256);
  CHECK_THROWS_AS(be.upload_weight(q6k), InputError);
}

TEST_CASE("cuda backend (emulated): operations refuse memory that is not the backend's, as a GPU would") {
  kernels::Backend& be = emulated();
  const StoredWeight sw(DType::F32, 8, 32, 1);
  const kernels::Weight w = be.upload_weight(sw.w);
  std::vector<float> host_x(32), host_y(8);
  kernels::Buffer<float> x(be, 32), y(be, 8), short_y(be, 7);
  CHECK_THROWS_AS(be.matmul(w, host_x.data(), 1, y.data()), std::logic_error);
  CHECK_THROWS_AS(be.matmul(w, x.data(), 1, host_y.data()), std::logic_error);
  CHECK_THROWS_AS(be.matmul(w, x.data(), 1, short_y.data()), std::logic_error);  // past the allocation's end
  CHECK_THROWS_AS(be.upload(host_y.data(), host_x.data(), 32), std::logic_error);
  // Weights are device memory too: one that upload_weight / upload_table did not copy is refused.
  CHECK_THROWS_AS(be.matmul(sw.w, x.data(), 1, y.data()), std::logic_error);
  const std::vector<int32_t> ids = {1};
  CHECK_THROWS_AS(be.embed(sw.w, ids, x.data()), std::logic_error);
  be.embed(be.upload_table(sw.w), ids, x.data());
  be.matmul(w, x.data(), 1, y.data());
}

TEST_CASE("cuda backend (emulated): tier copies count as pinned exactly when their host side is alloc_host memory") {
  const std::unique_ptr<kernels::Backend> be = kernels::make_cuda_emulated_backend();
  const size_t bytes = 4096;
  const kernels::PageId page = be->alloc_page(bytes);
  auto* pinned = static_cast<std::byte*>(be->alloc_host(bytes));
  std::vector<std::byte> pageable(bytes);
  be->copy_from_host(pinned, page, {0, bytes}).wait();
  be->copy_to_host(page, {0, bytes / 2}, pinned + bytes / 2).wait();  // inside the allocation, not at its start
  be->copy_to_host(page, {0, bytes}, pageable.data()).wait();
  const kernels::HostCopyCounts counts = kernels::emulated_host_copies(*be);
  CHECK(counts.pinned == 2);
  CHECK(counts.pinned_bytes == bytes + bytes / 2);
  CHECK(counts.pageable == 1);
  CHECK(counts.pageable_bytes == bytes);
  // alloc_host memory is host memory all the same: an operation handed it is refused, as a GPU would.
  CHECK_THROWS_AS(be->upload(pinned, pageable.data(), 16), std::logic_error);
  CHECK_THROWS_AS(be->release_host(pageable.data()), std::logic_error);
  CHECK_THROWS_AS(kernels::emulated_host_copies(testing::cpu_backend()), std::invalid_argument);
  be->release_host(pinned);
  be->free_page(page);
}

TEST_CASE("cuda backend (emulated): batched tier copies of pageable memory go through pinned staging, bits intact") {
  // A T2 entry's mapped file, a Redis value or a buffer written to T2/T3 is pageable memory: the device's copy
  // must still be from or to pinned memory (the pool's staging range), and the bytes must arrive unchanged.
  const std::unique_ptr<kernels::Backend> be = kernels::make_cuda_emulated_backend();
  const size_t page_bytes = 4096, n = 5;
  std::vector<kernels::PageId> pages;
  for (size_t i = 0; i < n; ++i) pages.push_back(be->alloc_page(page_bytes));
  std::vector<std::byte> from(n * page_bytes), back(n * page_bytes), middle(n * 1000);
  for (size_t i = 0; i < from.size(); ++i) from[i] = std::byte(i * 7 + 3);
  const kernels::HostCopyCounts before = kernels::emulated_host_copies(*be);
  be->copy_pages_from_host(from.data(), pages, {0, page_bytes}).wait();
  be->copy_pages_to_host(pages, {0, page_bytes}, back.data()).wait();
  be->copy_pages_to_host(pages, {1000, 1000}, middle.data()).wait();  // a part of each page
  const kernels::HostCopyCounts after = kernels::emulated_host_copies(*be);
  CHECK(back == from);
  for (size_t i = 0; i < n; ++i)
    CHECK(std::equal(middle.begin() + long(i * 1000), middle.begin() + long((i + 1) * 1000),
                     from.begin() + long(i * page_bytes + 1000)));
  CHECK(after.pageable == before.pageable);
  // The pieces (2 x 5 pages + 5 part pages) and the page numbers of the three copies, all pinned.
  CHECK(after.pinned_bytes - before.pinned_bytes == 2 * n * page_bytes + n * 1000 + 3 * n * sizeof(int32_t));
  // The pool's own memory needs no staging: the same copies from alloc_host memory move the same bytes.
  auto* pinned = static_cast<std::byte*>(be->alloc_host(n * page_bytes));
  be->copy_pages_to_host(pages, {0, page_bytes}, pinned).wait();
  CHECK(std::equal(pinned, pinned + n * page_bytes, from.begin()));
  be->release_host(pinned);
  for (kernels::PageId p : pages) be->free_page(p);
}

/// The message of the InputError `f` throws ("" when it throws none).
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.message() + " / " + e.hint();
  }
  return "";
}

TEST_CASE("cuda backend (emulated): a device of bounded memory refuses a KV budget it cannot hold, and names it when full") {
  const size_t mib = size_t(1) << 20;
  const std::unique_ptr<kernels::Backend> be = kernels::make_cuda_emulated_backend(8 * mib);
  const std::optional<kernels::Backend::DeviceMemory> empty = be->device_memory();
  REQUIRE(empty);
  CHECK(empty->total_bytes == 8 * mib);
  {
    const kernels::Buffer<float> b(*be, 1000);
    CHECK(be->device_memory()->free_bytes == empty->free_bytes - 4000);  // allocations are counted...
  }
  CHECK(be->device_memory()->free_bytes == empty->free_bytes);  // ...and given back
  // More than the device holds: the error of a full device.
  const std::string full = input_error_of([&] { be->alloc(9 * mib); });
  CAPTURE(full);
  CHECK(full.find("no room for 9.0 MiB") != std::string::npos);
  CHECK(full.find("8.0 MiB free of 8.0 MiB") != std::string::npos);
  CHECK(full.find("--cache-mib") != std::string::npos);

  // A T0 budget above the free memory is refused when the pool is made, naming the budget, the free memory
  // and the flag; one that fits is taken.
  const KvLayout kv{16, 2, 2, 32, DType::F32, DType::F32};
  REQUIRE(kv.page_bytes() == 16 * 1024);
  const std::string refused = input_error_of([&] { kv::PagePool pool(*be, kv, 9 * mib); });
  CAPTURE(refused);
  CHECK(refused.find("9.0 MiB") != std::string::npos);
  CHECK(refused.find("8.0 MiB free") != std::string::npos);
  CHECK(refused.find("--cache-mib") != std::string::npos);
  kv::PagePool pool(*be, kv, 3 * mib);
  std::vector<kernels::PageId> pages;
  for (size_t i = 0; i < 3 * mib / kv.page_bytes(); ++i) pages.push_back(pool.allocate());
  CHECK_THROWS_AS(pool.allocate(), InputError);  // the budget is spent
  // The pages' memory grew to the budget, not past it (doubling from 128 pages would have made 256).
  CHECK(be->device_memory()->free_bytes == empty->free_bytes - 3 * mib);
  // An allocation the device has no room for now names the budget beside the free memory.
  const std::string named = input_error_of([&] { be->alloc(6 * mib); });
  CAPTURE(named);
  CHECK(named.find("no room for 6.0 MiB") != std::string::npos);
  CHECK(named.find("budget (T0, --cache-mib) is 3.0 MiB") != std::string::npos);
  for (kernels::PageId p : pages) pool.release(p);

  // The CPU backend's pages are host memory: no device to compare a budget with.
  CHECK_FALSE(testing::cpu_backend().device_memory());
  CHECK_NOTHROW(kv::PagePool(testing::cpu_backend(), kv, size_t(1) << 40));
}

TEST_CASE("cuda backend (emulated): KV pages in f32, f16 and q8_0 are written byte for byte as the CPU backend writes them") {
  kernels::Backend& gpu = emulated();
  kernels::Backend& cpu = testing::cpu_backend();
  for (auto [kt, vt] : {std::pair{DType::F32, DType::F32}, {DType::F16, DType::F16}, {DType::Q8_0, DType::Q8_0},
                        {DType::Q8_0, DType::F16}, {DType::F16, DType::F32}}) {
    CAPTURE(int(kt));
    CAPTURE(int(vt));
    const kernels::KvLayout kv{16, 3, 2, 64, kt, vt};
    REQUIRE(gpu.supports_kv(kv));
    // 40 tokens over three pages, slots out of order; values with zeros, a tiny block and large magnitudes.
    const int n = 40;
    std::vector<float> k = random_values(size_t(n) * kv.kv_dim(), 21, 30.0f), v = random_values(k.size(), 22, 0.01f);
    std::fill_n(k.begin() + 64, 32, 0.0f);
    for (size_t i = 0; i < 32; ++i) v[i] = 1e-6f * float(i);
    std::vector<std::vector<std::byte>> images;
    for (kernels::Backend* be : {&gpu, &cpu}) {
      std::vector<kernels::PageId> pages = {be->alloc_page(kv.page_bytes()), be->alloc_page(kv.page_bytes()),
                                            be->alloc_page(kv.page_bytes())};
      std::vector<kernels::PageId> page_of(n);
      std::vector<int32_t> slot_of(n);
      for (int t = 0; t < n; ++t) {
        page_of[size_t(t)] = pages[size_t((t * 7) % 3)];
        slot_of[size_t(t)] = (t * 5) % 16;
      }
      // (page, slot) pairs repeat past 48 tokens only, so every token has its own place.
      const kernels::Buffer<float> k_on(*be, k), v_on(*be, v);
      for (int layer = 0; layer < kv.n_layers; ++layer) be->store_kv(kv, layer, page_of, slot_of, k_on.data(), v_on.data());
      images.emplace_back(3 * kv.page_bytes());
      for (size_t p = 0; p < 3; ++p) {
        be->copy_to_host(pages[p], {0, kv.page_bytes()}, images.back().data() + p * kv.page_bytes()).wait();
        be->free_page(pages[p]);
      }
    }
    CHECK(images[0] == images[1]);
  }
}

TEST_CASE("cuda backend (emulated): a model on f16 and q8_0 KV pages gives the CPU backend's logits on the same cache types") {
  // SmolLM2's attention shape (9 heads over 3 KV heads of 64: q8_0 needs heads of a multiple of 32), two layers,
  // random F32 weights. The two backends write the same page bytes from the same rows (test above), so they
  // differ only where float rounding of K or V moves a value across an f16 or q8_0 rounding boundary.
  model::SynthShape shape = *model::find_synth_shape("smollm2-135m");
  shape.name = "smollm2-2-layers";
  shape.block_count = 2;
  shape.vocab_size = 512;
  const auto [gpu, cpu] = testing::synthetic_on_both(shape, 3, [] { return kernels::make_cuda_emulated_backend(); });
  std::vector<model::Token> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 512);
  for (auto [kt, vt] : {std::pair{DType::F16, DType::F16}, {DType::Q8_0, DType::Q8_0}, {DType::Q8_0, DType::F16}}) {
    CAPTURE(int(kt));
    CAPTURE(int(vt));
    const std::vector<model::Token> then = {5, 77, 300};
    const double worst = worst_relative(session_logits(*gpu.model, prompt, then, 0, kt, vt),
                                        session_logits(*cpu.model, prompt, then, 0, kt, vt));
    MESSAGE("KV types (", int(kt), ", ", int(vt), "): CUDA kernels (emulated) vs CPU backend, max |Δlogit| / range = ", worst);
    CHECK(worst < 1e-3);
  }
}

TEST_CASE("cuda backend (emulated): the head shapes of every shipped model shape give the CPU backend's logits") {
  testing::check_shipped_heads([] { return kernels::make_cuda_emulated_backend(); }, "CUDA kernels (emulated)");
}

TEST_CASE("cuda backend (emulated): stories260K continues as shared/README.md says, with the CPU backend's logits") {
  testing::check_stories260k(*testing::stories260k_cuda_emulated().model, "CUDA kernels (emulated)");
}

TEST_CASE("cuda backend (emulated): SmolLM2-135M's Q4_1 file gives the logits of its weights dequantised to F32 by llama.cpp, on the CPU") {
  // The real model's shapes (9 query heads over 3 KV heads of 64, a 49,152-token vocabulary: 6,144 blocks of
  // the product kernel) with its Q4_1 and Q8_0 weights read by the kernel, against the CPU backend on the same
  // weights converted to F32 by llama.cpp's quantize tool. Both keep activations in f32, so they agree to float
  // rounding. Slow in emulation (about 3 s per token), so one short prompt and two decode steps.
  testing::LoadedModel gpu(testing::require_file(testing::default_model()), kernels::make_cuda_emulated_backend());
  const std::string& f32 = testing::smollm2_f32_path();
  testing::LoadedModel cpu(f32);
  const std::vector<model::Token> prompt = gpu.model->vocab().tokenize("The capital of France is", true, true);
  REQUIRE(prompt == cpu.model->vocab().tokenize("The capital of France is", true, true));
  const auto a = session_logits(*gpu.model, prompt, {}, 2), b = session_logits(*cpu.model, prompt, {}, 2);
  for (size_t i = 0; i < a.size(); ++i) CHECK(model::argmax(a[i]) == model::argmax(b[i]));
  const double worst = worst_relative(a, b);
  MESSAGE("SmolLM2 Q4_1 on the CUDA kernels (emulated) vs its F32 dequantisation on the CPU: max |Δlogit| / range = ", worst);
  CHECK(worst < 1e-4);
}

}  // namespace
}  // namespace choreo
