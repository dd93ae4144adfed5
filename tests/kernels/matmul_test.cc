// matmul against a float64 reference computed here from the dequantised weights and the exact activations,
// for every weight type, every SIMD level this CPU has, and shapes with odd row counts and tails.
//
// Tolerance for quantised weights (stated per output): as llama.cpp does, the kernels quantise each 32-value
// activation block to q = round(x * 127 / amax) with d = amax / 127 stored as d16 = fp16(d), so per element
// |x - d16*q| <= d/2 (+1e-3 relative for fp32 rounding) + 127 |d - d16|. Q4_1 also uses the block sum
// s16 = fp16(d * Σq) for its minimum m: |s16 - d16 Σq| <= (2^-10 d + |d - d16|) Σ|q| + 2^-25, with
// Σ|q| <= Σ (|x| * 127 / amax + 1/2). Hence |y_kernel - y_exact| <= Σ_j |w_j| e_block(j) + Σ_blocks |m| e_sum
// + (n_blocks + 4) · 2^-23 · Σ_j |w_j x_j|  (fp32 accumulation of one product per block, 1% margin).
// For float weights: |error| <= (n_in + 4) · 2^-23 · Σ_j |w_j x_j| (fp32 summation).
// The integer parts are exact, and every level performs the same fp32 operations in the same order, so for
// quantised weights all SIMD levels must agree bit for bit.

#include "kernels/cpu/matmul.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"
#include "common/error.h"

namespace choreo::kernels::cpu {
namespace {

/// A weight matrix encoded from random floats, with optional padding between rows.
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<double> dequantised;  // [n_out][n_in], exactly what the encoded weight means
  std::vector<double> minimums;     // [n_out][n_blocks], Q4_1's block minimums (else empty)
  Weight weight;
};

TestWeight make_weight(DType type, int64_t n_out, int64_t n_in, size_t row_padding, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  TestWeight t;
  const size_t row_size = row_bytes(type, n_in), stride = row_size + row_padding;
  t.bytes.assign(stride * n_out + 64, 0xcd);
  t.dequantised.resize(n_out * n_in);
  std::vector<float> row(n_in), back(n_in);
  for (int64_t r = 0; r < n_out; ++r) {
    // Rows of different magnitudes and a constant offset, so Q4_1's minimum matters.
    const float magnitude = 0.05f + static_cast<float>(r % 7) * 0.3f, offset = (r % 3 == 0) ? 0.7f : 0.0f;
    for (auto& v : row) v = normal(rng) * magnitude + offset;
    quantize_row(type, row.data(), t.bytes.data() + r * stride, n_in);
    dequantize_row(type, t.bytes.data() + r * stride, back.data(), n_in);
    for (int64_t i = 0; i < n_in; ++i) t.dequantised[r * n_in + i] = back[i];
    if (type == DType::Q4_1) {
      const auto* blocks = reinterpret_cast<const BlockQ4_1*>(t.bytes.data() + r * stride);
      for (int64_t b = 0; b < n_in / 32; ++b) t.minimums.push_back(fp16_to_fp32(blocks[b].m));
    }
  }
  t.weight = {type, t.bytes.data(), n_out, n_in, stride};
  return t;
}

std::vector<float> make_activations(int n, int64_t n_in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n * n_in);
  for (int64_t i = 0; i < n * n_in; ++i) {
    // Occasional outliers, as real activations have, make the per-block scales differ.
    x[i] = normal(rng) * ((i % 97 == 5) ? 20.0f : 1.0f);
  }
  return x;
}

bool is_quantised(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }

/// The exact product and the error bound of each output.
struct Reference {
  std::vector<double> y, bound;
};

Reference reference(const TestWeight& t, const std::vector<float>& x, int n) {
  const int64_t n_out = t.weight.n_out, n_in = t.weight.n_in, n_blocks = n_in / 32;
  Reference ref;
  ref.y.resize(n * n_out);
  ref.bound.resize(n * n_out);
  std::vector<double> element_error(n_in), sum_error(n_blocks);
  for (int c = 0; c < n; ++c) {
    const float* xc = x.data() + c * n_in;
    for (int64_t b = 0; b < n_blocks; ++b) {
      float max_abs = 0;
      for (int j = 0; j < 32; ++j) max_abs = std::max(max_abs, std::fabs(xc[b * 32 + j]));
      const double d = max_abs / 127.0f, d16 = fp16_to_fp32(fp32_to_fp16(max_abs / 127.0f));
      double q_magnitude = 0;
      for (int j = 0; j < 32; ++j)
        q_magnitude += max_abs > 0 ? std::fabs(xc[b * 32 + j]) * 127 / max_abs + 0.5 : 0;
      for (int j = 0; j < 32; ++j) element_error[b * 32 + j] = d / 2 * 1.001 + 127 * std::fabs(d - d16);
      sum_error[b] = (std::ldexp(d, -10) + std::fabs(d - d16)) * q_magnitude + std::ldexp(1.0, -25);
    }
    for (int64_t r = 0; r < n_out; ++r) {
      const double* wr = t.dequantised.data() + r * n_in;
      double sum = 0, magnitude = 0, activation_error = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        sum += wr[i] * xc[i];
        magnitude += std::fabs(wr[i] * xc[i]);
        activation_error += std::fabs(wr[i]) * element_error[i];
      }
      if (!t.minimums.empty()) {
        for (int64_t b = 0; b < n_blocks; ++b)
          activation_error += std::fabs(t.minimums[r * n_blocks + b]) * sum_error[b];
      }
      ref.y[c * n_out + r] = sum;
      const double u = std::ldexp(1.0, -23);
      ref.bound[c * n_out + r] = is_quantised(t.weight.type)
                                     ? activation_error + (n_blocks + 4) * u * magnitude * 1.01
                                     : (n_in + 4) * u * magnitude;
    }
  }
  return ref;
}

std::vector<SimdLevel> available_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
    if (static_cast<int>(l) <= static_cast<int>(detected_simd_level())) levels.push_back(l);
  }
  return levels;
}

/// Restores the detected SIMD level when a test ends.
struct LevelGuard {
  ~LevelGuard() { set_simd_level(detected_simd_level()); }
};

/// The weight with a packed copy, as the CPU backend uploads it. A quantised weight is packed exactly when
/// the CPU has AVX-512.
Weight packed_copy(const Weight& w) {
  Weight packed = w;
  packed.packed = pack_weight(w);
  const bool quantised = is_quantised(w.type);
  REQUIRE((packed.packed != nullptr) == (quantised && simd_level() == SimdLevel::Avx512));
  return packed;
}

constexpr int kGuard = 16;

/// Runs matmul into a NaN-filled buffer with guard cells; checks every output was written and no other.
std::vector<float> run(const Weight& w, const std::vector<float>& x, int n) {
  std::vector<float> y(n * w.n_out + kGuard, std::numeric_limits<float>::quiet_NaN());
  for (int g = 0; g < kGuard; ++g) y[n * w.n_out + g] = 12345.0f;
  matmul(w, x.data(), n, y.data());
  for (int g = 0; g < kGuard; ++g) REQUIRE(y[n * w.n_out + g] == 12345.0f);
  y.resize(n * w.n_out);
  return y;
}

TEST_CASE("matmul matches a float64 reference for every type, SIMD level and shape") {
  LevelGuard guard;
  const auto levels = available_levels();
  INFO("detected SIMD level: ", simd_level_name(detected_simd_level()));
  uint32_t seed = 1;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    for (int64_t n_in : {32, 576, 2048}) {
      for (int64_t n_out : {1, 17, 579}) {
        const TestWeight t = make_weight(type, n_out, n_in, n_out == 17 ? 6 : 0, seed++);
        // The same weight packed at load (AVX-512 only): every level must give the same bits with it.
        const Weight packed = packed_copy(t.weight);
        for (int n : {1, 2, 3, 7, 64, 130}) {
          const auto x = make_activations(n, n_in, seed++);
          const Reference ref = reference(t, x, n);
          std::vector<float> first;
          for (SimdLevel level : levels) {
            set_simd_level(level);
            CAPTURE(type_traits(type).name);
            CAPTURE(simd_level_name(level));
            CAPTURE(n);
            CAPTURE(n_out);
            CAPTURE(n_in);
            const std::vector<float> y = run(t.weight, x, n);
            int failures = 0;
            for (size_t i = 0; i < y.size(); ++i) {
              const double error = std::fabs(double(y[i]) - ref.y[i]);
              if (!(error <= ref.bound[i]) && failures++ < 3) {
                FAIL_CHECK("output ", i, ": got ", y[i], ", exact ", ref.y[i], ", bound ", ref.bound[i]);
              }
            }
            if (is_quantised(type)) {
              if (first.empty()) {
                first = y;
              } else if (std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) != 0) {
                FAIL_CHECK("differs from level ", simd_level_name(levels.front()), " in some bits");
              }
              const std::vector<float> y_packed = run(packed, x, n);
              if (std::memcmp(first.data(), y_packed.data(), y.size() * sizeof(float)) != 0) {
                FAIL_CHECK("the packed weight differs from level ", simd_level_name(levels.front()), " in some bits");
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("results do not depend on the number of threads") {
  kernels::cpu::ThreadPool& pool = kernels::cpu::kernel_pool();
  const int saved = pool.threads();
  for (DType type : {DType::F16, DType::Q8_0, DType::Q4_1}) {
    const TestWeight t = make_weight(type, 333, 256, 0, 77);
    const auto x = make_activations(9, 256, 78);
    const Weight packed = packed_copy(t.weight);
    pool.set_threads(1);
    const auto one = run(t.weight, x, 9);
    const auto one_packed = run(packed, x, 9);
    pool.set_threads(3);
    const auto three = run(t.weight, x, 9);
    const auto three_packed = run(packed, x, 9);
    CHECK(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(one.data(), one_packed.data(), one.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(one.data(), three_packed.data(), one.size() * sizeof(float)) == 0);
  }
  pool.set_threads(saved);
}

// The engine's equivalence guarantees (a message prefilled alone == the same tokens inside a longer prefill)
// need each output row to depend only on its own activation row, bit for bit.
TEST_CASE("a row's result does not depend on the other rows of the batch") {
  LevelGuard guard;
  for (SimdLevel level : available_levels()) {
    set_simd_level(level);
    for (DType type : {DType::F32, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
      CAPTURE(simd_level_name(level));
      CAPTURE(type_traits(type).name);
      const TestWeight t = make_weight(type, 100, 320, 0, 31);
      Weight packed = t.weight;
      packed.packed = pack_weight(t.weight);
      const auto x = make_activations(37, 320, 32);
      for (const Weight* w : {static_cast<const Weight*>(&t.weight), static_cast<const Weight*>(&packed)}) {
        const auto batch = run(*w, x, 37);
        for (int row : {0, 5, 36}) {
          const std::vector<float> alone_x(x.begin() + row * 320, x.begin() + (row + 1) * 320);
          const auto alone = run(*w, alone_x, 1);
          CHECK(std::memcmp(alone.data(), batch.data() + row * 100, 100 * sizeof(float)) == 0);
        }
      }
    }
  }
}

// matmul_group runs a layer's q, k and v (or gate and up) as one product on AVX-512: its panels are counted
// across the weights, so a thread's piece can end inside one weight and go on into the next. Every output
// must still be matmul's, weight by weight, bit for bit, and nothing outside the outputs may be written.
TEST_CASE("a group of products of one input gives each weight's matmul, bit for bit") {
  LevelGuard guard;
  kernels::cpu::ThreadPool& pool = kernels::cpu::kernel_pool();
  const int saved = pool.threads();
  const int64_t n_in = 256;
  const int64_t n_outs[] = {100, 16, 333};  // partial panels at the first weight's end and the last's
  const std::vector<std::vector<DType>> groups = {{DType::Q8_0, DType::Q8_0, DType::Q8_0},
                                                  {DType::Q4_0, DType::Q4_0, DType::Q4_0},
                                                  {DType::Q4_1, DType::Q4_1, DType::Q4_1},
                                                  {DType::Q4_1, DType::F16, DType::Q8_0}};  // not one product
  for (SimdLevel level : available_levels()) {
    set_simd_level(level);
    for (const std::vector<DType>& types : groups) {
      std::vector<TestWeight> weights;
      for (size_t j = 0; j < types.size(); ++j) weights.push_back(make_weight(types[j], n_outs[j], n_in, 0, 90 + j));
      for (bool packed : {false, true}) {
        std::vector<Weight> ws;
        for (const TestWeight& t : weights) ws.push_back(packed ? packed_copy(t.weight) : t.weight);
        for (int threads : {1, 3}) {
          pool.set_threads(threads);
          for (int n : {1, 4, 9, 20}) {
            CAPTURE(simd_level_name(level));
            CAPTURE(type_traits(types[0]).name);
            CAPTURE(packed);
            CAPTURE(threads);
            CAPTURE(n);
            const auto x = make_activations(n, n_in, 91);
            std::vector<std::vector<float>> ys;
            std::vector<MatmulOutput> outputs;
            for (const Weight& w : ws) {
              ys.emplace_back(n * w.n_out + kGuard, std::numeric_limits<float>::quiet_NaN());
              std::fill(ys.back().end() - kGuard, ys.back().end(), 12345.0f);
            }
            for (size_t j = 0; j < ws.size(); ++j) outputs.push_back({&ws[j], ys[j].data()});
            matmul_group(outputs, x.data(), n);
            for (size_t j = 0; j < ws.size(); ++j) {
              for (int g = 0; g < kGuard; ++g) REQUIRE(ys[j][n * ws[j].n_out + g] == 12345.0f);
              const auto alone = run(ws[j], x, n);
              CHECK(std::memcmp(alone.data(), ys[j].data(), alone.size() * sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
  pool.set_threads(saved);
}

TEST_CASE("float weights accept rows that are not a multiple of the vector width") {
  LevelGuard guard;
  for (SimdLevel level : available_levels()) {
    set_simd_level(level);
    for (DType type : {DType::F32, DType::F16, DType::BF16}) {
      const TestWeight t = make_weight(type, 21, 37, 2, 5);
      const auto x = make_activations(5, 37, 6);
      const Reference ref = reference(t, x, 5);
      const auto y = run(t.weight, x, 5);
      for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - ref.y[i]) <= ref.bound[i]);
    }
  }
}

TEST_CASE("dequantize_rows gathers the dequantised rows and rejects ids outside the table") {
  const TestWeight t = make_weight(DType::Q4_1, 50, 64, 0, 9);
  const std::vector<int32_t> ids = {3, 0, 49, 3};
  std::vector<float> out(ids.size() * 64);
  dequantize_rows(t.weight, ids, out.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int j = 0; j < 64; ++j) CHECK(out[i * 64 + j] == t.dequantised[ids[i] * 64 + j]);
  }
  const std::vector<int32_t> bad = {50}, negative = {-1};
  CHECK_THROWS_AS(dequantize_rows(t.weight, bad, out.data()), InputError);
  CHECK_THROWS_AS(dequantize_rows(t.weight, negative, out.data()), InputError);
}

TEST_CASE("unsupported weight types and partial blocks are input errors") {
  std::vector<uint8_t> bytes(4096);
  std::vector<float> x(256), y(16);
  Weight k_quant{DType::Q4_K, bytes.data(), 1, 256, 144};
  CHECK_THROWS_AS(matmul(k_quant, x.data(), 1, y.data()), InputError);
  Weight ragged{DType::Q8_0, bytes.data(), 1, 48, 51};
  CHECK_THROWS_AS(matmul(ragged, x.data(), 1, y.data()), InputError);
}

TEST_CASE("SIMD levels: names round-trip and a level above the CPU's is refused") {
  for (SimdLevel l : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
    CHECK(parse_simd_level(simd_level_name(l)) == l);
  }
  CHECK_FALSE(parse_simd_level("sse9").has_value());
  if (detected_simd_level() != SimdLevel::Avx512) {
    CHECK_THROWS_AS(set_simd_level(SimdLevel::Avx512), InputError);
  }
}

}  // namespace
}  // namespace choreo::kernels::cpu
