// `--repair` end to end on stories260K (docs/profile.md, "Repairing reused KV"): `choreo run --repair none`
// writes what a run without the flag writes, message by message; a policy repairs the call that reads a
// parent out of prefix and says so (n_repaired); `profile quality --repair P` compares none with P; a bad
// policy, or one outside choreo mode, exits 2 with what was expected.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// c reads b out of its prefix position (b was encoded alone).
const char* kPair = R"yaml(name: pair
sampling: {temperature: 0, max_tokens: 6}
steps:
  - decode: {as: a, header: "Once upon a time"}
  - decode: {as: b, header: "Tom had a dog."}
  - decode: {as: c, header: " At last", parents: [a, b]}
output: "{{ c }}"
)yaml";

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

testing::ProcessResult choreo(const testing::ScratchDir& dir, std::vector<std::string> args) {
  return testing::run_choreo_on(testing::shared_file("models/stories260K.gguf"), dir, std::move(args));
}

TEST_CASE(
    "choreo run --repair none writes what a run without the flag writes and a policy repairs the read out of "
    "prefix") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  const auto run = [&](std::vector<std::string> extra) {
    const fs::path out = dir.path / "run.json";
    std::vector<std::string> args = {"run", (dir.path / "pair.yaml").string(), "--no-store", "--json",
                                     out.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const testing::ProcessResult r = choreo(dir, args);
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    return read_json(out);
  };
  const json plain = run({}), none = run({"--repair", "none"}), first = run({"--repair", "first:3"});
  CHECK(none["output"] == plain["output"]);
  REQUIRE(none["messages"].size() == plain["messages"].size());
  for (size_t i = 0; i < plain["messages"].size(); ++i) {
    const json &a = plain["messages"][i], &b = none["messages"][i];
    CAPTURE(a["name"]);
    for (const char* key : {"name", "tokens", "text", "start_pos", "n_computed", "n_reused"})
      CHECK(a[key] == b[key]);
    CHECK_FALSE(b.contains("n_repaired"));
  }
  // first:3: only c reads a parent out of prefix (b, 3 tokens recomputed); a and b are as before.
  for (const json& m : first["messages"]) {
    CAPTURE(m["name"]);
    if (m["name"] == "c") {
      CHECK(m["n_repaired"] == 3);
    } else {
      CHECK_FALSE(m.contains("n_repaired"));
    }
  }
}

TEST_CASE("choreo profile quality --repair compares none with the policy") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  const fs::path report = dir.path / "quality.json";
  const testing::ProcessResult r = choreo(dir, {"profile", "quality", (dir.path / "pair.yaml").string(),
                                                "--repair", "first:100", "--json", report.string()});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const json doc = read_json(report);
  REQUIRE(doc["variants"].size() == 2);
  const json &none = doc["variants"][0], &repaired = doc["variants"][1];
  CHECK(none["variant"] == "none");
  CHECK(repaired["variant"] == "first:100");
  CHECK(none["workflow"]["kl"]["mean"] > 0.0);       // c reads b out of prefix
  CHECK(repaired["workflow"]["kl"]["mean"] < 1e-6);  // b recomputed whole: the baseline's KV, to rounding
  CHECK(r.out.find("first:100: KL(baseline || first:100)") != std::string::npos);
}

TEST_CASE("choreo profile quality --sweep writes its table, figures and the policy run --repair reads") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  const std::string wf = (dir.path / "pair.yaml").string();
  const fs::path out = dir.path / "sweep";
  const testing::ProcessResult r = choreo(dir, {"profile", "quality", wf, "--sweep", "--rounds", "2", "-o", out.string()});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  for (const char* file : {"sweep.md", "sweep.json", "pareto_computed.svg", "pareto_ttft.svg", "repair.json"})
    CHECK(fs::exists(out / file));
  const json doc = read_json(out / "sweep.json");
  const json& rows = doc["sweep"]["rows"];
  REQUIRE(rows.size() == 8);
  CHECK(rows[0]["policy"] == "none");
  CHECK(doc["quality"]["variants"].size() == 8);
  // The chosen policy, found again from the rows: the fewest tokens computed with KL under the bound.
  const double bound = doc["sweep"]["max_kl"];
  CHECK(bound == doctest::Approx(rows[0]["kl"]["mean"].get<double>() / 2));
  std::string cheapest;
  double cost = 1e300;
  for (const json& row : rows)
    if (row["kl"]["mean"].get<double>() <= bound && row["computed"].get<double>() < cost) {
      cost = row["computed"];
      cheapest = row["policy"];
    }
  CHECK(doc["sweep"]["chosen"] == cheapest);
  // Two rounds timed: two per-round speed-ups per policy.
  CHECK(doc["quality"]["variants"][1]["time"]["ttft_speedup_per_round"].size() == 2);
  // run --repair DIR/repair.json runs the chosen policy: what --repair POLICY gives.
  const auto run = [&](const std::string& repair) {
    const fs::path report = dir.path / "run.json";
    const testing::ProcessResult p =
        choreo(dir, {"run", wf, "--no-store", "--repair", repair, "--json", report.string()});
    CAPTURE(p.err);
    REQUIRE(p.exit_code == 0);
    json messages = read_json(report)["messages"];
    for (json& m : messages)  // times differ between any two runs
      for (const char* key : {"load_ms", "total_ms", "ttft_ms"}) m.erase(key);
    return messages;
  };
  CHECK(run((out / "repair.json").string()) == run(cheapest));
}

TEST_CASE("choreo profile quality --sweep: flags that need it, or exclude it, exit 2") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  std::ofstream(dir.path / "empty.json") << "{\"choreo_repair_policy\": 1}";
  const std::string wf = (dir.path / "pair.yaml").string();
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  for (const Case& c : {Case{{"profile", "quality", wf, "--max-kl", "0.1"}, "--sweep"},
                        Case{{"profile", "quality", wf, "-o", (dir.path / "o").string()}, "--sweep"},
                        Case{{"profile", "quality", wf, "--sweep", "--repair", "first:2"}, "--repair"},
                        Case{{"run", wf, "--repair", (dir.path / "empty.json").string()}, "no \"policy\""},
                        Case{{"run", wf, "--repair", (dir.path / "missing.json").string()}, "missing.json"}}) {
    const testing::ProcessResult r = choreo(dir, c.args);
    CAPTURE(c.expected);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.expected) != std::string::npos);
  }
}

TEST_CASE("choreo profile quality --sweep -o: a DIR that cannot be made exits 2 first, and a failed run makes none") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  std::ofstream(dir.path / "file") << "not a directory";
  const std::string wf = (dir.path / "pair.yaml").string();
  const testing::ProcessResult under_file =
      choreo(dir, {"profile", "quality", wf, "--sweep", "-o", (dir.path / "file" / "sweep").string()});
  CAPTURE(under_file.err);
  CHECK(under_file.exit_code == 2);
  CHECK(under_file.err.find("-o") != std::string::npos);
  // The run fails on its inputs after -o was checked: the directory is not made.
  const fs::path out = dir.path / "new" / "sweep";
  const testing::ProcessResult failed = choreo(
      dir, {"profile", "quality", wf, "--sweep", "-o", out.string(), "--inputs", (dir.path / "missing.jsonl").string()});
  CAPTURE(failed.err);
  CHECK(failed.exit_code == 2);
  CHECK_FALSE(fs::exists(dir.path / "new"));
}

TEST_CASE("choreo --repair: a bad policy or one outside choreo mode exits 2 saying what is expected") {
  testing::ScratchDir dir;
  std::ofstream(dir.path / "pair.yaml") << kPair;
  const std::string wf = (dir.path / "pair.yaml").string();
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  for (const Case& c :
       {Case{{"run", wf, "--repair", "blend"}, "first:K"},
        Case{{"run", wf, "--repair", "select:2"}, "R must be a fraction"},
        Case{{"run", wf, "--mode", "prefix", "--repair", "first:2"}, "choreo mode"},
        Case{{"profile", "quality", wf, "--repair", "first:0"}, "K must be a whole number"}}) {
    const testing::ProcessResult r = choreo(dir, c.args);
    CAPTURE(c.expected);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.expected) != std::string::npos);
  }
}

}  // namespace
}  // namespace choreo
