// `choreo profile reuse` end to end on stories260K with a synthetic adapter on layers 2-3 of its 5: the files it
// writes, the plan it chooses (the cheapest exact plan is [2, 5)), resuming from its log, refusing to overwrite
// one, and a workflow that names its plan file reading exactly what the same plan written inline reads.

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli_process.h"
#include "tests/runtime/reuse_data.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string workflow(const std::string& adapter, const std::string& reuse) {
  return "name: reader\n"
         "models:\n"
         "  sib: {lora: \"" + adapter + "\", reuse: " + reuse + "}\n"
         "messages:\n"
         "  story: {text: \"Once upon a time there was a little girl named Lily. She had a red ball.\"}\n"
         "steps:\n"
         "  - decode: {as: answer, model: sib, parents: [story], header: \" Lily\", max_tokens: 12, temperature: 0}\n"
         "output: \"{{ answer }}\"\n";
}

TEST_CASE("choreo profile reuse: sweep, plan file, resume, and a workflow reading through the plan file") {
  const std::string binary = testing::choreo_binary();
  const std::string model = testing::shared_file("models/stories260K.gguf");
  testing::ScratchDir scratch;
  const fs::path adapter = scratch.path / "synth.gguf";
  const testing::ProcessResult synth = testing::run_process(
      binary, {"model", "synth-lora", "-m", model, "--layers", "2-3", "--strength", "0.3", "-o", adapter.string()},
      scratch.path);
  REQUIRE_MESSAGE(synth.exit_code == 0, synth.err);
  const fs::path data = scratch.path / "data.json";
  testing::write_reuse_data(data.string());
  const fs::path out = scratch.path / "out";
  const std::vector<std::string> args{"profile", "reuse", "-m", model, "--receiver", adapter.string(),
                                      "--data", data.string(), "-o", out.string(), "--split", "67",
                                      "--max-tokens", "6", "--context-tokens", "64", "--quality", "kl",
                                      "--max-loss", "0", "--critical"};
  const testing::ProcessResult first = testing::run_process(binary, args, scratch.path);
  CAPTURE(first.err);
  REQUIRE(first.exit_code == 0);
  for (const char* f : {"runs.jsonl", "plans.json", "frontier.json", "heatmap.svg", "frontier.svg", "plan.json"})
    CHECK_MESSAGE(fs::exists(out / f), f);
  CHECK(slurp(out / "heatmap.svg").find("<svg") != std::string::npos);
  const json plan = json::parse(slurp(out / "plan.json"));
  CHECK(plan["plan"] == "partial");
  CHECK(plan["layers"] == json::parse("[[2, 5]]"));  // the adapter's layers and every layer after them
  CHECK(plan["n_layers"] == 5);
  CHECK(plan["train"]["n"] == 2);
  CHECK(plan["held_out"]["n"] == 1);
  CHECK(plan["train"]["kl"] == 0.0);
  CHECK(plan["held_out"]["kl"] == 0.0);  // exact on items it did not see too
  CHECK(plan.contains("critical_layers"));
  CHECK(first.out.find("Pareto frontier") != std::string::npos);
  // Every swept plan: reuse, the 14 ranges [s, e) of 5 layers but [0, 5), and recompute.
  CHECK(json::parse(slurp(out / "plans.json")).size() == 16);

  // Again without --resume: refused, the log untouched.
  const std::string log = slurp(out / "runs.jsonl");
  const testing::ProcessResult again = testing::run_process(binary, args, scratch.path);
  CHECK(again.exit_code == 2);
  CHECK(again.err.find("--resume") != std::string::npos);
  CHECK(slurp(out / "runs.jsonl") == log);
  // With --resume: everything from the log, the same plan.
  std::vector<std::string> resume = args;
  resume.push_back("--resume");
  const testing::ProcessResult resumed = testing::run_process(binary, resume, scratch.path);
  CAPTURE(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.err.find("(from the log)") != std::string::npos);
  CHECK(json::parse(slurp(out / "plan.json"))["layers"] == plan["layers"]);
  CHECK(slurp(out / "runs.jsonl") == log);
  // A log cut inside its last line (a killed run): that run is measured again and the log repaired.
  fs::resize_file(out / "runs.jsonl", log.size() - 10);
  const testing::ProcessResult repaired = testing::run_process(binary, resume, scratch.path);
  REQUIRE_MESSAGE(repaired.exit_code == 0, repaired.err);
  const std::string relog = slurp(out / "runs.jsonl");
  // The cut run again, after its item's reference (plans are scored against the reference's logits).
  CHECK(std::count(relog.begin(), relog.end(), '\n') == std::count(log.begin(), log.end(), '\n') + 1);
  CHECK(relog.back() == '\n');
  CHECK(json::parse(slurp(out / "plan.json"))["layers"] == plan["layers"]);
  // Other settings: the log is not theirs.
  std::vector<std::string> other = resume;
  other[other.size() - 9] = "7";  // --max-tokens
  REQUIRE(other[other.size() - 10] == "--max-tokens");
  const testing::ProcessResult mismatch = testing::run_process(binary, other, scratch.path);
  CHECK(mismatch.exit_code == 2);
  CHECK(mismatch.err.find("other settings") != std::string::npos);
  // A log broken before its last line is an error at its line, not skipped.
  std::ofstream(out / "runs.jsonl", std::ios::app) << "{not json\n{\"split\": \"train\"}\n";
  const testing::ProcessResult broken = testing::run_process(binary, resume, scratch.path);
  CHECK(broken.exit_code == 2);
  CHECK(broken.err.find("runs.jsonl:") != std::string::npos);

  // A workflow naming the plan file reads what the same plan written inline reads.
  const auto run = [&](const std::string& reuse) {
    const fs::path wf = scratch.path / "reader.yaml";
    std::ofstream(wf) << workflow(adapter.string(), reuse);
    return testing::run_process(binary, {"run", wf.string(), "-m", model, "--no-store"}, scratch.path);
  };
  const testing::ProcessResult by_file = run("\"" + (out / "plan.json").string() + "\"");
  const testing::ProcessResult inline_plan = run("{from: default, plan: partial, layers: [2, 5]}");
  const testing::ProcessResult recompute = run("[]");
  CAPTURE(by_file.err);
  REQUIRE(by_file.exit_code == 0);
  REQUIRE(inline_plan.exit_code == 0);
  CHECK(by_file.out == inline_plan.out);
  CHECK(by_file.out == recompute.out);  // [2, 5) is exact for this adapter

  // A plan file for another receiver, and one that is not a plan file: exit 2 at the declaration.
  const fs::path other_adapter = scratch.path / "other.gguf";
  REQUIRE(testing::run_process(binary, {"model", "synth-lora", "-m", model, "--seed", "9", "-o", other_adapter.string()},
                               scratch.path).exit_code == 0);
  const fs::path wf = scratch.path / "wrong.yaml";
  std::ofstream(wf) << workflow(other_adapter.string(), "\"" + (out / "plan.json").string() + "\"");
  const testing::ProcessResult wrong = testing::run_process(binary, {"run", wf.string(), "-m", model}, scratch.path);
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.err.find("was profiled for the receiver") != std::string::npos);
  CHECK(wrong.err.find("wrong.yaml:3:") != std::string::npos);
  std::ofstream(scratch.path / "junk.json") << "{\"plan\": \"partial\"}";
  std::ofstream(wf) << workflow(adapter.string(), "junk.json");
  const testing::ProcessResult junk = testing::run_process(binary, {"run", wf.string(), "-m", model}, scratch.path);
  CHECK(junk.exit_code == 2);
  CHECK(junk.err.find("not a reuse plan file") != std::string::npos);
}

TEST_CASE("choreo profile reuse: bad flags exit 2 before anything runs") {
  const std::string binary = testing::choreo_binary();
  const std::string model = testing::shared_file("models/stories260K.gguf");
  testing::ScratchDir scratch;
  const fs::path data = scratch.path / "data.json";
  testing::write_reuse_data(data.string());
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{"profile", "reuse", "-m", model, "--data", data.string(), "-o",
                                  (scratch.path / "out").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_process(binary, args, scratch.path);
  };
  const testing::ProcessResult same = run({"--receiver", "default"});
  CHECK(same.exit_code == 2);
  CHECK(same.err.find("same model") != std::string::npos);
  const testing::ProcessResult missing = run({"--receiver", (scratch.path / "nope.gguf").string()});
  CHECK(missing.exit_code == 2);
  const testing::ProcessResult quality = run({"--receiver", model, "--quality", "bleu"});
  CHECK(quality.exit_code == 2);
  const testing::ProcessResult budget = run({"--receiver", model, "--max-loss", "-1"});
  CHECK(budget.exit_code == 2);
  CHECK(budget.err.find("--max-loss") != std::string::npos);
  CHECK(!fs::exists(scratch.path / "out" / "runs.jsonl"));
  const testing::ProcessResult no_workflow = testing::run_process(binary, {"profile"}, scratch.path);
  CHECK(no_workflow.exit_code == 2);
  CHECK(no_workflow.err.find("needs a workflow file") != std::string::npos);
}

}  // namespace
}  // namespace choreo
