// `choreo profile quality` end to end on stories260K: on a prefix chain (each decode reading the decodes
// before it) every KL figure of its --json report is 0, every rank 1 and agreement 1; bad input (a missing
// workflow, a workflow error, a missing inputs file, a row that is not JSON) is reported with its file (and
// line:col where there is one), exit code 2, nothing on stdout and no report written.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kChain = R"yaml(name: chain
inputs: {start: string}
sampling: {temperature: 0, max_tokens: 6}
steps:
  - decode: {as: a, header: "{{ start }}"}
  - decode: {as: b, header: " Then", parents: [a]}
  - decode: {as: c, header: " At last", parents: [a, b]}
output: "{{ c }}"
)yaml";

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST_CASE("choreo profile quality: a prefix chain has KL 0 in every figure of its JSON report") {
  testing::ScratchDir dir;
  write(dir.path / "chain.yaml", kChain);
  write(dir.path / "rows.jsonl", "{\"start\": \"Once upon a time\"}\n{\"start\": \"Tom had a dog.\"}\n");
  const fs::path report = dir.path / "quality.json";
  const testing::ProcessResult r =
      testing::run_process(testing::choreo_binary(),
                           {"profile", "quality", (dir.path / "chain.yaml").string(), "--inputs",
                            (dir.path / "rows.jsonl").string(), "-m",
                            testing::shared_file("models/stories260K.gguf"), "--json", report.string()},
                           dir.path);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("per step, then the workflow") != std::string::npos);
  const json doc = read_json(report);
  CHECK(doc["workflow"] == "chain");
  CHECK(doc["baseline_mode"] == "prefix");
  CHECK(doc["instances"] == 2);
  REQUIRE(doc["variants"].size() == 1);
  const json& v = doc["variants"][0];
  CHECK(v["variant"] == "choreo");
  REQUIRE(v["calls"].size() == 6);
  for (const json& c : v["calls"]) {
    CAPTURE(c.dump());
    CHECK(c["positions"] == 6);
    CHECK(c["kl"]["mean"] == 0.0);
    CHECK(c["kl"]["max"] == 0.0);
    CHECK(c["rank"]["max"] == 1);
    CHECK(c["agreement"] == 1.0);
  }
  CHECK(v["calls"][3]["line"] == 2);
  REQUIRE(v["steps"].size() == 3);
  for (const json* s : {&v["steps"][0], &v["steps"][1], &v["steps"][2], &v["workflow"]}) {
    CAPTURE(s->dump());
    CHECK((*s)["kl"]["mean"] == 0.0);
    CHECK((*s)["kl"]["low"] == 0.0);
    CHECK((*s)["kl"]["high"] == 0.0);
    CHECK((*s)["agreement"]["mean"] == 1.0);
    CHECK((*s)["instances"] == 2);
  }
  CHECK(v["workflow"]["positions"] == 36);
}

TEST_CASE("choreo profile quality: bad input is located and exits 2 before any model loads") {
  testing::ScratchDir dir;
  write(dir.path / "chain.yaml", kChain);
  write(dir.path / "typo.yaml",
        std::string(kChain).replace(std::string(kChain).find("[a, b]"), 6, "[a, bb]"));
  write(dir.path / "rows.jsonl", "{\"start\": \"Once upon a time\"}\nnot json\n");
  const std::string chain = (dir.path / "chain.yaml").string(), rows = (dir.path / "rows.jsonl").string();
  const fs::path report = dir.path / "quality.json";
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"nope.yaml", "--inputs", rows}, "nope.yaml"},
      {{(dir.path / "typo.yaml").string(), "--inputs", rows}, "typo.yaml:7:"},
      {{chain, "--inputs", (dir.path / "missing.jsonl").string()}, "missing.jsonl"},
      {{chain, "--inputs", rows}, "rows.jsonl:2:2: line 2 is not valid JSON"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"profile", "quality"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    args.insert(args.end(), {"-m", "/nonexistent/model.gguf", "--json", report.string()});
    const testing::ProcessResult r = testing::run_process(testing::choreo_binary(), args, dir.path);
    CAPTURE(c.expected);
    CAPTURE(r.err);
    CHECK(r.exited);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.expected) != std::string::npos);
    CHECK(r.err.find("hint:") != std::string::npos);
    CHECK(r.out.empty());
    CHECK_FALSE(fs::exists(report));
  }
}

}  // namespace
}  // namespace choreo
