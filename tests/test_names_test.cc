// ctest runs every doctest case on its own (doctest_discover_tests in CMakeLists.txt), by passing its name
// to --test-case. CMake reads the list of names as a CMake list: a name with ';' is split into two names that
// match nothing, so the case would "pass" without running; and a '[' without its ']' (as in "partial [0, L)")
// keeps CMake from splitting the list there, so the names after it ran together and `ctest -N` failed with
// "add_test called with incorrect number of arguments" (issue 42, finding 13). No case may have ';', '[' or
// ']'. scripts/test.sh checks that `ctest -N` lists every case.

#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

TEST_CASE("test case names have no semicolon or square bracket (ctest would run nothing for them)") {
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
    CHECK(line.find_first_of(";[]") == std::string::npos);
  }
  CHECK(names > 100);
}

}  // namespace
}  // namespace choreo
