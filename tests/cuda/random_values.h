#pragma once
// Seeded uniform floats for the CUDA emulator tests.

#include <random>
#include <vector>

namespace choreo::testing {

/// n floats uniform in [-scale, scale], seeded.
inline std::vector<float> random_values(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace choreo::testing
