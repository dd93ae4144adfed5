#pragma once
// Where tests find shared data and the default model. A missing file is a failing test with a hint.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "common/input_file.h"
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

/// For its scope, the input policy the CLI's --allow-path and --max-input-mib set (docs/limits.md): files named
/// inside workflows and schemas may also come from `allowed` (e.g. a workflow in a scratch directory naming the
/// shared adapters), and `max_input_mib` (0: the defaults) bounds input files. The default policy is back
/// afterwards.
class InputPolicyScope {
 public:
  explicit InputPolicyScope(const std::vector<std::string>& allowed, uint64_t max_input_mib = 0) {
    configure_input_policy(max_input_mib, allowed);
  }
  ~InputPolicyScope() { configure_input_policy(0, {}); }
  InputPolicyScope(const InputPolicyScope&) = delete;
  InputPolicyScope& operator=(const InputPolicyScope&) = delete;
};

/// InputPolicyScope's `allowed` for the shared models (the adapters tests name in workflow text).
inline std::vector<std::string> shared_models_dir() {
  return {std::filesystem::weakly_canonical(shared_dir() / "models").string()};
}

}  // namespace choreo::testing
