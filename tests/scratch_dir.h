#pragma once
// Files for tests: a scratch directory to write in, and reading a whole file back.

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <string>

#include "common/error.h"

namespace choreo::testing {

/// A fresh directory under the temp dir, removed with everything in it when the object dies.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           fmt::format("choreo-test-{}-{}", ::getpid(), counter.fetch_add(1));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

/// The whole content of a file (empty when it cannot be read).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/// The rendered InputError `f` throws, or "(no InputError)" when it throws none.
inline std::string input_error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.render();
  }
  return "(no InputError)";
}

}  // namespace choreo::testing
