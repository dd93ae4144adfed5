// Repair beside fine-tuning (docs/profile.md, "Choosing a repair policy"): `profile quality --finetuned`
// runs an adapter on the compared side only, against the model's own exact baseline, and `eval --repair`
// repairs choreo mode's reads, records the policy in each row it writes, and resumes a file only under the
// same policy. On stories260K, with synthetic adapters.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/model/synth_lora.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// c reads b out of its prefix position (b was encoded alone).
const char* kPair = R"yaml(name: pair
inputs: {story: string}
sampling: {temperature: 0, max_tokens: 6}
steps:
  - decode: {as: a, header: "Once upon a time"}
  - decode: {as: b, header: "{{ story }}"}
  - decode: {as: c, header: " At last", parents: [a, b]}
output: "{{ c }}"
)yaml";

testing::ProcessResult choreo(const testing::ScratchDir& dir, std::vector<std::string> args) {
  return testing::run_choreo_on(testing::shared_file("models/stories260K.gguf"), dir, std::move(args));
}

/// The workflow KL of each variant of a --json report, by name.
std::map<std::string, double> kl_by_variant(const fs::path& report) {
  std::ifstream in(report);
  const json doc = json::parse(in);
  std::map<std::string, double> out;
  for (const json& v : doc["variants"]) out[v["variant"]] = v["workflow"]["kl"]["mean"];
  return out;
}

TEST_CASE("choreo profile quality --finetuned runs the adapter on the compared side only") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  const auto quality = [&](float strength) {
    model::SynthLoraSpec spec;
    spec.strength = strength;
    const fs::path adapter = dir.path / "adapter.gguf";
    model::write_synthetic_lora(*testing::stories260k().model, spec, adapter.string());
    const fs::path report = dir.path / "quality.json";
    const testing::ProcessResult r =
        choreo(dir, {"profile", "quality", (dir.path / "pair.yaml").string(), "--input", "story=Tom had a dog.",
                     "--finetuned", adapter.string(), "--repair", "first:100", "--json", report.string()});
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    return kl_by_variant(report);
  };
  // An adapter that adds nothing (B = 0): its variants give the figures of the ones without it.
  const std::map<std::string, double> zero = quality(0.0f);
  REQUIRE(zero.size() == 4);
  for (const char* name : {"none", "adapter", "first:100", "adapter+first:100"}) CHECK(zero.contains(name));
  CHECK(zero.at("none") > 0.0);
  CHECK(zero.at("adapter") == doctest::Approx(zero.at("none")).epsilon(1e-6));
  CHECK(zero.at("first:100") < 1e-6);  // b recomputed whole: the baseline's KV, to rounding
  CHECK(zero.at("adapter+first:100") < 1e-6);
  // A real change: the adapter's distributions move away from the base model's baseline (and the baseline is
  // the base model's: none is what it was).
  const std::map<std::string, double> moved = quality(0.05f);
  CHECK(moved.at("none") == doctest::Approx(zero.at("none")).epsilon(1e-9));
  CHECK(moved.at("adapter") > 2 * moved.at("none"));
  CHECK(moved.at("adapter+first:100") > 1e-4);
}

std::vector<json> rows_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

TEST_CASE("choreo eval --repair repairs choreo mode, records the policy, and resumes only under it") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  std::ofstream(dir.path / "d.jsonl") << "{\"id\": \"r1\", \"story\": \"Tom had a dog.\", \"answer\": \"dog\"}\n"
                                         "{\"id\": \"r2\", \"story\": \"The sun was warm.\", \"answer\": \"sun\"}\n";
  const fs::path out = dir.path / "out.jsonl";
  const auto eval = [&](std::vector<std::string> more) {
    std::vector<std::string> args = {"eval",     (dir.path / "pair.yaml").string(), "--data", (dir.path / "d.jsonl").string(),
                                     "--format", "jsonl", "--metric", "qa_f1", "--mode", "prefix", "--mode", "choreo",
                                     "--out",    out.string()};
    args.insert(args.end(), more.begin(), more.end());
    return choreo(dir, args);
  };
  const testing::ProcessResult r = eval({"--repair", "first:100"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<json> rows = rows_of(out);
  REQUIRE(rows.size() == 4);
  std::map<std::string, std::string> prefix;
  for (const json& row : rows)
    if (row["mode"] == "prefix") {
      CHECK_FALSE(row["extra"].contains("repair"));
      prefix[row["id"]] = row["prediction"];
    }
  for (const json& row : rows)
    if (row["mode"] == "choreo") {
      CHECK(row["extra"]["repair"] == "first:100");
      // b recomputed whole in c's context: greedy choreo gives the exact baseline's answer.
      CHECK(row["prediction"] == prefix[row["id"]]);
    }
  // Resumed under another policy, with nothing left to run or a row more: refused (not summarised as this
  // run's), the file left as it was; under the same policy, nothing left to run is a summary.
  const testing::ProcessResult nothing_left = eval({"--repair", "first:2", "--resume"});
  CHECK(nothing_left.exit_code == 2);
  CHECK(nothing_left.err.find("--repair") != std::string::npos);
  const testing::ProcessResult same = eval({"--repair", "first:100", "--resume"});
  CAPTURE(same.err);
  CHECK(same.exit_code == 0);
  std::ofstream(dir.path / "d.jsonl", std::ios::app) << "{\"id\": \"r3\", \"story\": \"A cat sat.\", \"answer\": \"cat\"}\n";
  const testing::ProcessResult other = eval({"--repair", "first:2", "--resume"});
  CHECK(other.exit_code == 2);
  CHECK(other.err.find("--repair") != std::string::npos);
  CHECK(rows_of(out).size() == 4);
}

}  // namespace
}  // namespace choreo
