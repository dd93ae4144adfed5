// `choreo run --trace` draws every agent's steps-to-execution as a counter track ("steps to AGENT"), and
// `choreo check --steps` prints the same numbers (dsl/plan/steps_to_execution.h), on the real binary.

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

fs::path workflow_file(const std::string& name) {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  return fs::path(src ? src : ".") / "workflows" / name;
}

TEST_CASE("run --trace has one steps-to-execution counter track per agent, check --steps prints them") {
  testing::ScratchDir s;
  const fs::path trace = s.path / "t.json";
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  const testing::ProcessResult r = testing::run_process(
      testing::choreo_binary(),
      {"run", workflow_file("prisoners.yaml").string(), "-m", testing::shared_file("models/stories260K.gguf"),
       "--trace", trace.string()},
      s.path, options);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const nlohmann::json doc = nlohmann::json::parse(testing::read_file(trace));
  std::map<std::string, std::vector<int64_t>> counters;  // track -> values in time order
  for (const nlohmann::json& e : doc["traceEvents"])
    if (e["ph"] == "C") counters[e["name"].get<std::string>()].push_back(e["args"]["steps"].get<int64_t>());
  REQUIRE(counters.size() == 2);
  // prisoners (rounds 2): 8 steps, a sample before the first and after each. Alice runs at steps 1, 3, 5, 7,
  // Bob at 2, 4, 6, 7 (worked out in tests/dsl/steps_to_execution_test.cc); -1 = never again.
  CHECK(counters["steps to alice"] == std::vector<int64_t>{1, 0, 1, 0, 1, 0, 1, 0, -1});
  CHECK(counters["steps to bob"] == std::vector<int64_t>{2, 1, 0, 1, 0, 1, 0, 0, -1});

  const testing::ProcessResult c =
      testing::run_process(testing::choreo_binary(), {"check", workflow_file("prisoners.yaml").string(), "--steps"},
                           s.path, options);
  CHECK(c.exit_code == 1);  // prisoners leaks by design
  CHECK(c.out.find("start:         alice 1, bob 2") != std::string::npos);
  CHECK(c.out.find("after step 6:  alice 0, bob 0") != std::string::npos);
  CHECK(c.out.find("decide_prompt 7") != std::string::npos);
}

}  // namespace
}  // namespace choreo
