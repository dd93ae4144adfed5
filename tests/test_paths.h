#pragma once
// Where tests find shared data and the default model. A missing file is a failing test with a hint.

#include <cstdlib>
#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include "common/paths.h"

namespace choreo::testing {

/// ../shared, or $CHOREO_SHARED.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("CHOREO_SHARED")) return env;
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  std::filesystem::path root = src ? src : std::filesystem::current_path();
  return root / ".." / "shared";
}

/// The default instruct model as scripts/setup.sh installs it (override with $CHOREO_MODEL).
inline std::filesystem::path default_model() { return choreo::default_model_path(); }

/// Returns the path of a shared file, failing the test (with a hint) if it is missing.
inline std::string require_file(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) {
    FAIL("missing test input ", p.string(),
         " — run scripts/setup.sh (default model) or set CHOREO_SHARED to the shared/ directory");
  }
  return p.string();
}

inline std::string shared_file(const std::string& rel) { return require_file(shared_dir() / rel); }

}  // namespace choreo::testing
