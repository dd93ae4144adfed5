// Properties of the scalar and block formats: conversions against float64 definitions (exhaustive over all
// 16-bit patterns), byte layouts from the ggml format spec, round-trip error bounds derived from each format,
// and ggml's quantiser invariants on a real llama.cpp-quantised model.

#include "kernels/quant.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "runtime/model/gguf.h"
#include "tests/test_paths.h"

namespace choreo::kernels {
namespace {

// binary16 by definition: (-1)^s * 2^(e-15) * (1 + m/1024), subnormals 2^-14 * m/1024.
double half_definition(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 10) & 31, mantissa = bits & 1023;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa / 1024.0, -14);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return sign ? -magnitude : magnitude;
}

// bfloat16 by definition: 8 exponent bits (bias 127), 7 mantissa bits.
double bf16_definition(uint16_t bits) {
  const int sign = bits >> 15, exponent = (bits >> 7) & 255, mantissa = bits & 127;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa / 128.0, -126);
  } else if (exponent == 255) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  }
  return sign ? -magnitude : magnitude;
}

bool same_value(double expected, float got) {
  return std::isnan(expected) ? std::isnan(got) : static_cast<double>(got) == expected;
}

TEST_CASE("fp16 -> fp32 equals the binary16 definition for all 65536 patterns") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    if (!same_value(half_definition(bits), fp16_to_fp32(bits))) FAIL("pattern ", b);
    if (!std::isnan(half_definition(bits))) {
      if (fp32_to_fp16(fp16_to_fp32(bits)) != bits) FAIL("round trip of pattern ", b);
    } else {
      CHECK(std::isnan(fp16_to_fp32(fp32_to_fp16(fp16_to_fp32(bits)))));
    }
  }
}

TEST_CASE("bf16 -> fp32 equals the bfloat16 definition for all 65536 patterns") {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    if (!same_value(bf16_definition(bits), bf16_to_fp32(bits))) FAIL("pattern ", b);
    if (!std::isnan(bf16_definition(bits))) {
      if (fp32_to_bf16(bf16_to_fp32(bits)) != bits) FAIL("round trip of pattern ", b);
    } else {
      CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(bf16_to_fp32(bits)))));
    }
  }
}

// For each pair of neighbouring finite non-negative codes (a, a+1) the float64 midpoint must round to the
// even code, and the floats just below/above it to a and a+1. With sign symmetry this pins
// round-to-nearest-even over the whole range, including the subnormal/normal boundary and overflow to
// infinity.
template <typename Decode, typename Encode>
void check_midpoints(uint16_t first_non_finite, Decode decode, Encode encode) {
  for (uint32_t a = 0; a + 1 <= first_non_finite; ++a) {
    const double low = decode(static_cast<uint16_t>(a));
    // The code after the largest finite one is infinity; its midpoint is where overflow starts.
    const double high = a + 1 == first_non_finite ? 2 * low - decode(static_cast<uint16_t>(a - 1))
                                                  : decode(static_cast<uint16_t>(a + 1));
    const double middle = (low + high) / 2;
    const auto mid = static_cast<float>(middle);
    REQUIRE(static_cast<double>(mid) == middle);  // midpoints are exact floats for both formats
    const uint16_t even = (a & 1) ? static_cast<uint16_t>(a + 1) : static_cast<uint16_t>(a);
    for (int sign = 0; sign < 2; ++sign) {
      const float s = sign ? -1.0f : 1.0f;
      const uint16_t sign_bit = sign ? 0x8000 : 0;
      if (encode(s * mid) != (even | sign_bit)) FAIL("midpoint above code ", a);
      if (encode(s * std::nextafter(mid, 0.0f)) != (a | sign_bit)) FAIL("below midpoint above code ", a);
      if (encode(s * std::nextafter(mid, INFINITY)) != ((a + 1) | sign_bit))
        FAIL("above midpoint above code ", a);
    }
  }
}

TEST_CASE("fp32 -> fp16 rounds to nearest even at every midpoint") {
  check_midpoints(0x7c00, half_definition, fp32_to_fp16);
  CHECK(fp32_to_fp16(INFINITY) == 0x7c00);
  CHECK(fp32_to_fp16(-INFINITY) == 0xfc00);
  CHECK(fp32_to_fp16(1e10f) == 0x7c00);
  CHECK(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
  CHECK(fp32_to_fp16(1e-30f) == 0x0000);
  CHECK(fp32_to_fp16(-1e-30f) == 0x8000);
}

TEST_CASE("fp32 -> bf16 rounds to nearest even at every midpoint") {
  check_midpoints(0x7f80, bf16_definition, fp32_to_bf16);
  CHECK(fp32_to_bf16(INFINITY) == 0x7f80);
  CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
  CHECK(fp32_to_bf16(std::bit_cast<float>(0x7fc00001u)) == 0x7fc0);
}

TEST_CASE("known bit patterns") {
  CHECK(fp32_to_fp16(1.0f) == 0x3c00);
  CHECK(fp32_to_fp16(-2.0f) == 0xc000);
  CHECK(fp32_to_fp16(65504.0f) == 0x7bff);
  CHECK(fp32_to_fp16(0x1p-24f) == 0x0001);
  CHECK(fp32_to_fp16(0x1p-14f) == 0x0400);
  CHECK(fp32_to_fp16(1.0f / 3.0f) == 0x3555);
  CHECK(fp32_to_bf16(1.0f) == 0x3f80);
  CHECK(fp32_to_bf16(3.14159265f) == 0x4049);
  CHECK(fp32_to_bf16(-0.0f) == 0x8000);
}

std::vector<float> random_floats(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> values(n);
  for (auto& v : values) v = normal(rng);
  return values;
}

TEST_CASE("Q8_0 block layout: fp16 scale then 32 signed bytes, max |x| maps to 127") {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 127.0f / 16.0f;  // x[0] = -127
  uint8_t bytes[34];
  quantize_row(DType::Q8_0, x, bytes, 32);
  CHECK(bytes[0] == 0x00);  // d = 1.0 = 0x3c00, little endian
  CHECK(bytes[1] == 0x3c);
  for (int i = 0; i < 32; ++i) CHECK(static_cast<int8_t>(bytes[2 + i]) == static_cast<int>(std::round(x[i])));
}

TEST_CASE("Q4_0 block layout: element j in the low nibble of byte j, element j+16 in the high nibble") {
  float x[32];
  for (int j = 0; j < 16; ++j) {
    x[j] = static_cast<float>(j - 8);       // -8..7, the extreme -8 sets d = 1
    x[j + 16] = static_cast<float>(7 - j);  // 7..-8
  }
  uint8_t bytes[18];
  quantize_row(DType::Q4_0, x, bytes, 32);
  CHECK(bytes[0] == 0x00);
  CHECK(bytes[1] == 0x3c);
  for (int j = 0; j < 16; ++j) CHECK(bytes[2 + j] == ((j) | ((15 - j) << 4)));
  float back[32];
  dequantize_row(DType::Q4_0, bytes, back, 32);
  for (int i = 0; i < 32; ++i) CHECK(back[i] == x[i]);
}

TEST_CASE("Q4_1 block layout: fp16 scale, fp16 minimum, nibbles as Q4_0") {
  float x[32];
  for (int j = 0; j < 16; ++j) {
    x[j] = 2.0f + 0.5f * static_cast<float>(j);  // min 2, max 9.5: d = 0.5
    x[j + 16] = 9.5f - 0.5f * static_cast<float>(j);
  }
  uint8_t bytes[20];
  quantize_row(DType::Q4_1, x, bytes, 32);
  CHECK(bytes[0] == 0x00);  // 0.5 = 0x3800
  CHECK(bytes[1] == 0x38);
  CHECK(bytes[2] == 0x00);  // 2.0 = 0x4000
  CHECK(bytes[3] == 0x40);
  for (int j = 0; j < 16; ++j) CHECK(bytes[4 + j] == (j | ((15 - j) << 4)));
}

// fp16 rounds a normal value by at most 2^-11 relative.
constexpr double kHalfRelative = 1.0 / 2048.0;

// Error bounds: with d the exact scale and d16 the stored (fp16-rounded) one, x - q*d16 = (x - q*d) + q*(d -
// d16), so |error| <= (rounding step)/2 + max|q| * |d - d16| (+ a relative 1e-6 for float arithmetic).
TEST_CASE("Q8_0 round trip: |error| <= d/2 + 127 |d - d16|") {
  for (float spread : {1e-3f, 1.0f, 300.0f}) {
    const auto x = random_floats(32 * 200, 7, spread);
    std::vector<BlockQ8_0> blocks(200);
    std::vector<float> back(x.size());
    quantize_row(DType::Q8_0, x.data(), blocks.data(), static_cast<int64_t>(x.size()));
    dequantize_row(DType::Q8_0, blocks.data(), back.data(), static_cast<int64_t>(x.size()));
    for (size_t b = 0; b < blocks.size(); ++b) {
      double max_abs = 0;
      for (int i = 0; i < 32; ++i) max_abs = std::max(max_abs, std::fabs(double(x[b * 32 + i])));
      const double d = max_abs / 127;
      const double bound = (d / 2 + 127 * std::fabs(d - fp16_to_fp32(blocks[b].d))) * (1 + 1e-6);
      bool has_extreme = false;
      for (int i = 0; i < 32; ++i) {
        CHECK(std::fabs(double(x[b * 32 + i]) - back[b * 32 + i]) <= bound);
        has_extreme |= std::abs(blocks[b].qs[i]) == 127;
      }
      CHECK(has_extreme);
    }
  }
}

TEST_CASE("Q4_0 round trip: |error| <= |d|/2 (|d| at the clamped +8 end) + 8 |d - d16|") {
  const auto x = random_floats(32 * 300, 11, 2.0f);
  std::vector<BlockQ4_0> blocks(300);
  std::vector<float> back(x.size());
  quantize_row(DType::Q4_0, x.data(), blocks.data(), static_cast<int64_t>(x.size()));
  dequantize_row(DType::Q4_0, blocks.data(), back.data(), static_cast<int64_t>(x.size()));
  for (size_t b = 0; b < blocks.size(); ++b) {
    double max_abs = 0;
    for (int i = 0; i < 32; ++i) max_abs = std::max(max_abs, std::fabs(double(x[b * 32 + i])));
    const double d = max_abs / 8;
    for (int i = 0; i < 32; ++i) {
      const double v = x[b * 32 + i];
      const bool clamped = std::fabs(v) > 7.5 * d && std::fabs(v) != max_abs;
      const double rounding = 8 * std::fabs(d - std::fabs(fp16_to_fp32(blocks[b].d)));
      const double bound = ((clamped ? d : d / 2) + rounding) * (1 + 1e-6);
      CHECK(std::fabs(v - back[b * 32 + i]) <= bound);
    }
  }
}

TEST_CASE("Q4_1 round trip: |error| <= d/2 + 15 |d - d16| + |min - m16|") {
  const auto x = random_floats(32 * 300, 13, 5.0f);
  std::vector<BlockQ4_1> blocks(300);
  std::vector<float> back(x.size());
  quantize_row(DType::Q4_1, x.data(), blocks.data(), static_cast<int64_t>(x.size()));
  dequantize_row(DType::Q4_1, blocks.data(), back.data(), static_cast<int64_t>(x.size()));
  for (size_t b = 0; b < blocks.size(); ++b) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < 32; ++i) {
      lo = std::min(lo, double(x[b * 32 + i]));
      hi = std::max(hi, double(x[b * 32 + i]));
    }
    const double d = (hi - lo) / 15;
    const double bound =
        (d / 2 + 15 * std::fabs(d - fp16_to_fp32(blocks[b].d)) + std::fabs(lo - fp16_to_fp32(blocks[b].m))) *
        (1 + 1e-5);
    for (int i = 0; i < 32; ++i) CHECK(std::fabs(double(x[b * 32 + i]) - back[b * 32 + i]) <= bound);
  }
}

TEST_CASE("F16 and BF16 rows round every element to nearest") {
  const auto x = random_floats(1000, 17, 10.0f);
  std::vector<uint16_t> half(1000), brain(1000);
  std::vector<float> back(1000);
  quantize_row(DType::F16, x.data(), half.data(), 1000);
  quantize_row(DType::BF16, x.data(), brain.data(), 1000);
  dequantize_row(DType::F16, half.data(), back.data(), 1000);
  for (int i = 0; i < 1000; ++i) CHECK(std::fabs(double(x[i]) - back[i]) <= std::fabs(x[i]) * kHalfRelative);
  dequantize_row(DType::BF16, brain.data(), back.data(), 1000);
  for (int i = 0; i < 1000; ++i) CHECK(std::fabs(double(x[i]) - back[i]) <= std::fabs(x[i]) / 256.0);
}

TEST_CASE("all-zero and constant blocks encode without dividing by zero") {
  std::vector<float> zeros(32, 0.0f), threes(32, 3.0f), back(32);
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    std::vector<uint8_t> bytes(row_bytes(t, 32));
    quantize_row(t, zeros.data(), bytes.data(), 32);
    dequantize_row(t, bytes.data(), back.data(), 32);
    for (float v : back) CHECK(v == 0.0f);
  }
  std::vector<uint8_t> bytes(row_bytes(DType::Q4_1, 32));
  quantize_row(DType::Q4_1, threes.data(), bytes.data(), 32);
  dequantize_row(DType::Q4_1, bytes.data(), back.data(), 32);
  for (float v : back) CHECK(v == 3.0f);
}

TEST_CASE("unsupported types and partial blocks are input errors") {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> bytes(1024);
  CHECK_THROWS_AS(quantize_row(DType::Q6_K, x.data(), bytes.data(), 256), InputError);
  CHECK_THROWS_AS(dequantize_row(DType::Q5_0, bytes.data(), x.data(), 32), InputError);
  CHECK_THROWS_AS(quantize_row(DType::Q8_0, x.data(), bytes.data(), 33), InputError);
}

// llama.cpp's quantiser maps each block's extremes onto the ends of the code range; a file it wrote must show
// that in every block, and re-quantising a dequantised Q8_0 block must reproduce its bytes exactly.
TEST_CASE("ggml quantiser invariants hold on a llama.cpp-quantised model") {
  const auto file = gguf::File::open(choreo::testing::require_file(choreo::testing::default_model()));
  int checked_q8 = 0, checked_q41 = 0;
  for (const auto& tensor : file.tensors()) {
    const int64_t n_blocks = std::min<int64_t>(tensor.n_elements() / 32, 4096);
    if (tensor.type == DType::Q8_0) {
      const auto* blocks = reinterpret_cast<const BlockQ8_0*>(tensor.data);
      std::vector<float> values(32);
      BlockQ8_0 again{};
      for (int64_t b = 0; b < n_blocks; ++b) {
        dequantize_row(DType::Q8_0, &blocks[b], values.data(), 32);
        quantize_row(DType::Q8_0, values.data(), &again, 32);
        if (std::memcmp(&again, &blocks[b], sizeof again) != 0) FAIL(tensor.name, " block ", b);
      }
      ++checked_q8;
    } else if (tensor.type == DType::Q4_1) {
      const auto* blocks = reinterpret_cast<const BlockQ4_1*>(tensor.data);
      for (int64_t b = 0; b < n_blocks; ++b) {
        if (blocks[b].d == 0) continue;
        int lowest = 15, highest = 0;
        for (uint8_t byte : blocks[b].qs) {
          lowest = std::min({lowest, byte & 15, byte >> 4});
          highest = std::max({highest, byte & 15, byte >> 4});
        }
        if (lowest != 0 || highest != 15) FAIL(tensor.name, " block ", b, " codes ", lowest, "..", highest);
      }
      ++checked_q41;
    }
  }
  CHECK(checked_q8 > 0);
  CHECK(checked_q41 > 0);
}

}  // namespace
}  // namespace choreo::kernels
