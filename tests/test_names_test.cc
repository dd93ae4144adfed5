// ctest runs every doctest case on its own (doctest_discover_tests in CMakeLists.txt), by passing its name
// to --test-case. A name with ';' is split by CMake into two names that match nothing, so the case would
// "pass" without running: no case may have one.

#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

TEST_CASE("test case names have no semicolon (ctest would run nothing for them)") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  testing::ProcessOptions options;
  options.timeout_seconds = 60;
  testing::ScratchDir dir;  // where the listing's stdout.txt / stderr.txt go (not the checkout)
  const testing::ProcessResult r = testing::run_process(self, {"--list-test-cases"}, dir.str(), options);
  REQUIRE(r.exit_code == 0);
  std::istringstream lines(r.out);
  int names = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[doctest]", 0) == 0 || line.rfind("=====", 0) == 0) continue;
    ++names;
    CAPTURE(line);
    CHECK(line.find(';') == std::string::npos);
  }
  CHECK(names > 100);
}

}  // namespace
}  // namespace choreo
