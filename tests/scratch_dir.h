#pragma once
// A scratch directory for tests that write files.

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

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

}  // namespace choreo::testing
