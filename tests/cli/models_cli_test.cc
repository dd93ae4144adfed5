// Several models from the command line: `choreo exec` with --lora-modules and a per-call "model", and
// `choreo run` on a workflow that declares `models:`. Each call on a model gives what a process running only
// that model gives; a bad model name exits 2 with its location.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli_process.h"
#include "tests/model/lora_fixtures.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<json> lines_of(const std::string& out) {
  std::vector<json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(json::parse(line));
  return lines;
}

const json& by_id(const std::vector<json>& lines, const std::string& id) {
  for (const json& j : lines)
    if (j.value("id", "") == id) return j;
  FAIL("no result for ", id);
  static json none;
  return none;
}

TEST_CASE("choreo exec: a call's \"model\" picks a --lora-modules adapter, as a process with only that adapter would run it") {
  const std::string binary = testing::choreo_binary();
  const std::string model = testing::require_file(testing::default_model());
  testing::ScratchDir scratch;
  const fs::path calls = scratch.path / "calls.jsonl";
  std::ofstream(calls)
      << R"({"op": "prefill", "id": "q", "role": "user", "text": "What is 7 times 6?"})" "\n"
      << R"({"op": "decode", "id": "a", "parents": ["q"], "role": "assistant", "model": "math", "temperature": 0, "max_tokens": 12})" "\n"
      << R"({"op": "decode", "id": "b", "parents": ["q", "a"], "role": "user", "header": "Check:", "temperature": 0, "max_tokens": 6})" "\n";
  const testing::ProcessResult two =
      testing::run_process(binary, {"exec", "-m", model, "--lora-modules", "math=" + testing::math_lora(),
                                    calls.string()}, scratch.path);
  CAPTURE(two.err);
  REQUIRE(two.exit_code == 0);
  const std::vector<json> mixed = lines_of(two.out);
  const json& q = by_id(mixed, "q");
  const json& a = by_id(mixed, "a");
  const json& b = by_id(mixed, "b");
  CHECK(a["model"] == "math");
  CHECK(a["n_cross_model"] == q["tokens"].size());
  CHECK(!b.contains("model"));
  CHECK(b["n_cross_model"].get<size_t>() == a["header_tokens"].size() + a["tokens"].size());

  // The same first two calls on a process whose only model is the adapter.
  const fs::path only = scratch.path / "only.jsonl";
  std::ofstream(only)
      << R"({"op": "prefill", "id": "q", "role": "user", "text": "What is 7 times 6?"})" "\n"
      << R"({"op": "decode", "id": "a", "parents": ["q"], "role": "assistant", "temperature": 0, "max_tokens": 12})" "\n";
  const testing::ProcessResult one =
      testing::run_process(binary, {"exec", "-m", model, "--lora", testing::math_lora(), only.string()}, scratch.path);
  REQUIRE(one.exit_code == 0);
  CHECK(by_id(lines_of(one.out), "a")["tokens"] == a["tokens"]);

  // A model the run does not have: exit 2 at the line, nothing run.
  std::ofstream(calls) << R"({"op": "prefill", "id": "q", "text": "Hi"})" "\n"
                       << R"({"op": "decode", "id": "a", "parents": ["q"], "header": " x", "model": "maths"})" "\n";
  const testing::ProcessResult bad =
      testing::run_process(binary, {"exec", "-m", model, "--lora-modules", "math=" + testing::math_lora(),
                                    calls.string()}, scratch.path);
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.empty());
  CHECK(bad.err.find("calls.jsonl:2:") != std::string::npos);
  CHECK(bad.err.find("'maths' is not a model of this run") != std::string::npos);
  CHECK(bad.err.find("math") != std::string::npos);
}

TEST_CASE("choreo run: a workflow's `models:` are loaded, and --json names each call's model") {
  const std::string binary = testing::choreo_binary();
  const std::string model = testing::require_file(testing::default_model());
  testing::ScratchDir scratch;
  const fs::path workflow = scratch.path / "pair.yaml";
  std::ofstream(workflow) << "name: pair\n"
                          << "models:\n  math: {lora: " << testing::math_lora() << "}\n"
                          << "agents:\n  solver: {model: math}\n  critic:\n"
                          << "messages:\n  q: {role: user, text: \"What is 7 times 6?\"}\n"
                          << "steps:\n"
                          << "  - decode: {as: a, agent: solver, parents: [q], role: assistant, max_tokens: 8, temperature: 0}\n"
                          << "  - decode: {as: b, agent: critic, parents: [q, a], role: user, header: \"Check:\", max_tokens: 4, temperature: 0}\n"
                          << "output: \"{{ a }}\"\n";
  const fs::path report = scratch.path / "run.json";
  const testing::ProcessResult r = testing::run_process(
      binary, {"run", workflow.string(), "-m", model, "--no-store", "--json", report.string()}, scratch.path);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  std::ifstream in(report);
  const json j = json::parse(in);
  bool saw_a = false;
  for (const json& m : j["messages"]) {
    if (m["name"] == "a") {
      saw_a = true;
      CHECK(m["model"] == "math");
      CHECK(m["n_cross_model"].get<int>() > 0);
    }
    if (m["name"] == "b") CHECK(!m.contains("model"));
  }
  CHECK(saw_a);

  // A model file that is not there: exit 2 at the declaration, before the run.
  std::ofstream(workflow) << "name: pair\nmodels:\n  math: {lora: no-such.gguf}\n"
                          << "steps:\n  - decode: {as: a, header: \" x\", model: math, max_tokens: 1}\n";
  const testing::ProcessResult bad =
      testing::run_process(binary, {"run", workflow.string(), "-m", model, "--no-store"}, scratch.path);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("pair.yaml:3:") != std::string::npos);
  CHECK(bad.err.find("no-such.gguf") != std::string::npos);
}

}  // namespace
}  // namespace choreo
