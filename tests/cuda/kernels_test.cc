// choreo's CUDA elementwise kernels (kernels/cuda/kernels/elementwise.cuh) run in the block emulator against
// the CPU backend (issue 14): RMSNorm within float rounding of the CPU's, SwiGLU, RoPE (both layouts, Llama-3
// factors, a per-segment shift and the inverse rotation), embedding and Q8_0/Q4_0/Q4_1 dequantisation bit
// for bit; over every shipped model's shapes, block sizes from one warp to 1024 threads, partial blocks, and
// more than 65,535 blocks. No out-of-bounds access or shared-memory race is reported (the emulator would
// throw).

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/kernels/elementwise.cuh"
#include "kernels/quant.h"
#include "tests/cuda/random_values.h"

namespace choreo::cuda {
namespace {

using cu::make_ptr;

using testing::random_values;

::choreo::kernels::Backend& cpu() {
  static std::unique_ptr<::choreo::kernels::Backend> b = ::choreo::kernels::make_cpu_backend(1);
  return *b;
}

// (dim, heads, head_dim) of stories260K, SmolLM2-135M and the Llama-3.2-1B shape.
struct Shape {
  int dim, n_heads, head_dim;
};
constexpr Shape kShapes[] = {{64, 8, 8}, {576, 9, 64}, {2048, 32, 64}};

TEST_CASE("cuda kernels (emulated): rmsnorm is the CPU's within float rounding, for every block size") {
  for (const Shape& s : kShapes)
    for (unsigned threads : {32u, 64u, 256u, 1024u}) {
      const int rows = 3;
      const std::vector<float> x = random_values(size_t(rows) * s.dim, 1, 3.0f), w = random_values(size_t(s.dim), 2);
      std::vector<float> want(x.size()), got(x.size(), -7.0f);
      cpu().rmsnorm(x.data(), w.data(), rows, s.dim, 1e-5f, want.data());
      cu::launch("rmsnorm", kernels::rmsnorm, Dim3(rows), Dim3(threads), 0, nullptr, make_ptr(x.data(), x.size()),
                 make_ptr(w.data(), w.size()), s.dim, 1e-5f, make_ptr(got.data(), got.size()));
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])) / (std::abs(want[i]) + 1e-6));
      CAPTURE(s.dim);
      CAPTURE(threads);
      CHECK(worst < 2e-6);
    }
}

TEST_CASE("cuda kernels (emulated): swiglu equals the CPU's bit for bit, over a grid-stride loop") {
  const size_t n = 1536 * 5 + 17;
  const std::vector<float> g = random_values(n, 3, 6.0f), u = random_values(n, 4);
  std::vector<float> want(n), got(n);
  cpu().swiglu(g.data(), u.data(), n, want.data());
  cu::launch("swiglu", kernels::swiglu, Dim3(7), Dim3(64), 0, nullptr, make_ptr(g.data(), n), make_ptr(u.data(), n), n,
             make_ptr(got.data(), n));
  CHECK(got == want);
}

TEST_CASE("cuda kernels (emulated): rope equals the CPU's bit for bit, a shift is a repositioning, sign -1 undoes it") {
  const std::vector<float> factors = random_values(32, 5, 0.5f);
  for (const Shape& s : kShapes)
    for (int interleaved : {1, 0})
      for (bool with_factors : {false, true}) {
        if (with_factors && s.head_dim != 64) continue;
        const int rows = 4;
        const std::vector<float> x = random_values(size_t(rows) * s.n_heads * s.head_dim, 6);
        const std::vector<int32_t> pos = {0, 7, 4095, 131071};
        ::choreo::kernels::RopeParams p;
        p.n_dims = s.head_dim;
        p.freq_base = 500000.0f;
        p.layout = interleaved ? ::choreo::kernels::RopeParams::Layout::Interleaved
                               : ::choreo::kernels::RopeParams::Layout::Halves;
        std::vector<float> abs_factors(factors.size());
        for (size_t i = 0; i < factors.size(); ++i) abs_factors[i] = 1.0f + std::abs(factors[i]) * 8;
        if (with_factors) p.freq_factors = abs_factors.data();
        const kernels::RopeArgs args{s.head_dim, p.freq_base, interleaved, with_factors ? 1 : 0};
        CAPTURE(s.dim);
        CAPTURE(interleaved);
        CAPTURE(with_factors);
        const auto run = [&](std::vector<float>& v, int shift, int sign, unsigned threads) {
          cu::launch("rope", kernels::rope, Dim3(rows), Dim3(threads), 0, nullptr, make_ptr(v.data(), v.size()),
                     s.n_heads, s.head_dim, make_ptr(pos.data(), pos.size()), shift, sign, args,
                     make_ptr(abs_factors.data(), abs_factors.size()));
        };
        std::vector<float> want = x, got = x;
        cpu().rope(want.data(), rows, s.n_heads, s.head_dim, pos.data(), p);
        run(got, 0, 1, 128);
        CHECK(got == want);
        // Shifted by 3: the CPU's rotation at pos - 3.
        std::vector<int32_t> moved(pos);
        for (int32_t& q : moved) q -= 3;
        std::vector<float> want_moved = x, got_moved = x;
        cpu().rope(want_moved.data(), rows, s.n_heads, s.head_dim, moved.data(), p);
        run(got_moved, 3, 1, 32);
        CHECK(got_moved == want_moved);
        // The inverse rotation brings the values back (within rounding).
        run(got, 0, -1, 1024);
        double worst = 0;
        for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - x[i])));
        CHECK(worst < 1e-5);
      }
}

TEST_CASE("cuda kernels (emulated): embedding rows, and more than 65,535 blocks") {
  const int dim = 8, vocab = 300, n = 70000;
  const std::vector<float> table = random_values(size_t(vocab) * dim, 7);
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[size_t(i)] = (i * 7919) % vocab;
  std::vector<float> got(size_t(n) * dim, -1.0f);
  cu::launch("embed_f32", kernels::embed_f32, Dim3(n), Dim3(32), 0, nullptr, make_ptr(table.data(), table.size()), dim,
             make_ptr(ids.data(), ids.size()), make_ptr(got.data(), got.size()));
  bool same = true;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < dim; ++k) same = same && got[size_t(i) * dim + k] == table[size_t(ids[size_t(i)]) * dim + k];
  CHECK(same);
}

TEST_CASE("cuda kernels (emulated): Q8_0, Q4_0 and Q4_1 dequantise as the CPU does, bit for bit") {
  using ::choreo::kernels::DType;
  const int64_t n = 32 * 97;
  const std::vector<float> x = random_values(size_t(n), 8, 4.0f);
  const std::pair<DType, kernels::BlockFormat> formats[] = {{DType::Q8_0, kernels::BlockFormat::Q8_0},
                                                            {DType::Q4_0, kernels::BlockFormat::Q4_0},
                                                            {DType::Q4_1, kernels::BlockFormat::Q4_1}};
  for (const auto& [dtype, format] : formats) {
    std::vector<uint8_t> blocks(size_t(n / 32) * size_t(kernels::block_bytes(format)));
    ::choreo::kernels::quantize_row(dtype, x.data(), blocks.data(), n);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
    ::choreo::kernels::dequantize_row(dtype, blocks.data(), want.data(), n);
    cu::launch("dequantize", kernels::dequantize, Dim3(5), Dim3(96), 0, nullptr, make_ptr(blocks.data(), blocks.size()),
               format, size_t(n), make_ptr(got.data(), got.size()));
    CAPTURE(int(format));
    CHECK(got == want);
  }
  // Every fp16 bit pattern that is a number converts as the CPU's fp16_to_fp32 does.
  bool same = true;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = ::choreo::kernels::fp16_to_fp32(uint16_t(h));
    const float got = kernels::half_to_float(h);
    if (std::isnan(want)) same = same && std::isnan(got);
    else same = same && std::memcmp(&want, &got, 4) == 0;
  }
  CHECK(same);
}

TEST_CASE("cuda kernels: float to fp16 rounds as the CPU's fp32_to_fp16, on every rounding boundary and random bits") {
  // Every fp16 value, and the midpoints and neighbours between consecutive ones (ties to even, subnormals,
  // overflow to infinity), then 4 million random float bit patterns (NaNs included).
  size_t differ = 0, n = 0;
  const auto check = [&](float x) {
    ++n;
    differ += kernels::float_to_half_bits(x) != ::choreo::kernels::fp32_to_fp16(x);
  };
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = ::choreo::kernels::fp16_to_fp32(uint16_t(h)), b = ::choreo::kernels::fp16_to_fp32(uint16_t(h + 1));
    const float mid = float((double(a) + double(b)) / 2);
    for (float x : {a, mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)}) check(x);
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 4'000'000; ++i) {
    const uint32_t bits = rng();
    float x;
    std::memcpy(&x, &bits, 4);
    check(x);
  }
  CHECK(differ == 0);
  CHECK(n > 4'200'000);
}

}  // namespace
}  // namespace choreo::cuda
