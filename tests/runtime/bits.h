#pragma once
// Bit-for-bit comparison of float results (logits step by step, pages): the tests of batch invariance and of
// the KV tiers require the same bits, not closeness.

#include <cstring>
#include <vector>

namespace choreo::testing {

inline bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline bool bit_identical(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t s = 0; s < a.size(); ++s)
    if (!bit_identical(a[s], b[s])) return false;
  return true;
}

}  // namespace choreo::testing
