#pragma once
// What the libFuzzer targets in tests/fuzz share (they cannot use the doctest helpers in tests/).

#include <cstdlib>
#include <filesystem>
#include <string_view>

namespace choreo::fuzz {

/// Lines in a text (1 + newlines): the range an error's line must fall in.
inline int line_count(std::string_view text) {
  int n = 1;
  for (char c : text) n += c == '\n';
  return n;
}

/// The shared data: $CHOREO_SHARED, else $CHOREO_SOURCE_DIR/../shared (scripts/fuzz.sh sets both).
inline std::filesystem::path shared_dir() {
  if (const char* shared = std::getenv("CHOREO_SHARED")) return shared;
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  return std::filesystem::path(source ? source : ".") / ".." / "shared";
}

}  // namespace choreo::fuzz
