// Several models from the command line: `choreo exec` with --lora-modules and a per-call "model", and
// `choreo run` on a workflow that declares `models:`. Each call on a model gives what a process running only
// that model gives; a bad model name exits 2 with its location.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/engine/model_set.h"
#include "runtime/exec/reuse_plan_file.h"
#include "runtime/model/lora.h"
#include "tests/cli_process.h"
#include "tests/model/lora_fixtures.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
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

TEST_CASE("choreo exec: --reuse-plan reads another model's messages through a plan file's plan") {
  const std::string binary = testing::choreo_binary();
  const std::string model = testing::require_file(testing::default_model());
  testing::ScratchDir scratch;
  // The fingerprints the plan files bind to, as choreo computes them for -m and for -m with the adapter.
  const model::Model& base = *testing::smollm2().model;
  runtime::ModelSet set(base);
  set.add("math", base, model::LoraStack{{{model::LoraAdapter::load(testing::math_lora(), base), 1.0f}}});
  const int n_layers = base.config().n_layers;
  const auto plan_file = [&](const std::string& name, uint64_t sender, uint64_t receiver,
                             const runtime::CrossModelPlan& plan) {
    const fs::path path = scratch.path / name;
    std::ofstream(path) << exec::reuse_plan_json({{"fingerprint", fmt::format("{:016x}", sender)}, {"spec", "default"}},
                                                 {{"fingerprint", fmt::format("{:016x}", receiver)}, {"spec", "math"}},
                                                 n_layers, plan)
                               .dump();
    return path.string();
  };
  const std::string every_layer = plan_file("all.json", set[0].fingerprint, set[1].fingerprint,
                                            runtime::CrossModelPlan::partial(0, n_layers));
  const std::string reuse = plan_file("reuse.json", set[0].fingerprint, set[1].fingerprint,
                                      runtime::CrossModelPlan{runtime::CrossModelPlan::Kind::Reuse});
  const std::string stranger = plan_file("stranger.json", set[0].fingerprint, 0x1234, runtime::CrossModelPlan{});
  const fs::path calls = scratch.path / "calls.jsonl";
  std::ofstream(calls)
      << R"({"op": "prefill", "id": "q", "role": "user", "text": "What is 7 times 6?"})" "\n"
      << R"({"op": "decode", "id": "a", "parents": ["q"], "role": "assistant", "model": "math", "temperature": 0, "max_tokens": 10})" "\n";
  const auto exec_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"exec", "-m", model, "--lora-modules", "math=" + testing::math_lora()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(calls.string());
    return testing::run_process(binary, args, scratch.path);
  };
  const testing::ProcessResult plain = exec_with({});
  const testing::ProcessResult all = exec_with({"--reuse-plan", every_layer});
  const testing::ProcessResult reused = exec_with({"--reuse-plan", reuse});
  REQUIRE(plain.exit_code == 0);
  CAPTURE(all.err);
  REQUIRE(all.exit_code == 0);
  REQUIRE(reused.exit_code == 0);
  const std::vector<json> plain_lines = lines_of(plain.out), all_lines = lines_of(all.out),
                          reused_lines = lines_of(reused.out);
  const json& a = by_id(plain_lines, "a");
  // partial over every layer is recompute, token for token; reuse computes nothing across models.
  CHECK(by_id(all_lines, "a")["tokens"] == a["tokens"]);
  CHECK(by_id(all_lines, "a")["n_cross_model"] == a["n_cross_model"]);
  CHECK(a["n_cross_model"].get<int>() > 0);
  CHECK(!by_id(reused_lines, "a").contains("n_cross_model"));  // written only when nonzero
  // A plan for a receiver the run does not have: exit 2, nothing run.
  const testing::ProcessResult bad = exec_with({"--reuse-plan", stranger});
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.empty());
  CHECK(bad.err.find("stranger.json") != std::string::npos);
  CHECK(bad.err.find("which no model of this run is") != std::string::npos);
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
  // The adapter is outside the workflow's directory: refused (exit 2, at the declaration) until allowed.
  const testing::ProcessResult outside =
      testing::run_process(binary, {"run", workflow.string(), "-m", model, "--no-store"}, scratch.path);
  CHECK(outside.exit_code == 2);
  CHECK(outside.err.find("pair.yaml:3:") != std::string::npos);
  CHECK(outside.err.find("leads outside the directory of pair.yaml") != std::string::npos);
  CHECK(outside.err.find("--allow-path") != std::string::npos);
  const testing::ProcessResult r = testing::run_process(
      binary,
      {"run", workflow.string(), "-m", model, "--no-store", "--json", report.string(), "--allow-path",
       testing::shared_models_dir()[0]},
      scratch.path);
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
