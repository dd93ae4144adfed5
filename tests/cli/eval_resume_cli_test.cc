// `choreo eval --resume` and the rows it finds in --out (issue 42, finding 11): a score written in the file
// is never taken on trust, since the summary scores each row again from its prediction; a score no metric
// gives (1e308 printed "inf [0.00, -nan]") is refused at its line; and a row without the models' fingerprint
// is refused unless --accept-old-results says to keep it. Each refusal leaves the file as it was.

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
using json = nlohmann::ordered_json;  // the file's key order kept
using testing::ProcessResult;
using testing::read_file;

/// An eval of a one-token workflow over two rows on stories260K, into any results file.
struct TinyEval {
  testing::ScratchDir scratch;
  fs::path workflow = scratch.path / "w.yaml", data = scratch.path / "d.jsonl";
  TinyEval() {
    std::ofstream(workflow)
        << "name: w\ninputs: {question: string}\nmessages:\n  m: {text: \"{{ question }}\"}\n"
           "steps:\n  - decode: {as: a, parents: [m], header: \" a\", max_tokens: 2}\n"
           "output: \"{{ a }}\"\n";
    std::ofstream(data) << "{\"id\": \"r1\", \"question\": \"Once upon\", \"answer\": \"time\"}\n"
                           "{\"id\": \"r2\", \"question\": \"The dog\", \"answer\": \"ran\"}\n";
  }
  ProcessResult run(const fs::path& out, std::vector<std::string> more = {}) const {
    std::vector<std::string> args = {
        "eval",  workflow.string(), "--data", data.string(), "--format",
        "jsonl", "--metric",        "qa_f1",  "-m",          testing::shared_file("models/stories260K.gguf"),
        "--out", out.string(),      "--json"};
    args.insert(args.end(), more.begin(), more.end());
    testing::ProcessOptions options;
    options.timeout_seconds = 120;
    return testing::run_process(testing::choreo_binary(), args, scratch.path, options);
  }
};

/// The rows of a results file, one JSON object a line.
std::vector<json> rows_of(const std::string& text) {
  std::vector<json> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

std::string lines_of(const std::vector<json>& rows) {
  std::string text;
  for (const json& row : rows) text += row.dump() + "\n";
  return text;
}

}  // namespace

TEST_CASE(
    "eval --resume: the summary scores rows again from their predictions, whatever score the file holds") {
  const TinyEval eval;
  const fs::path out = eval.scratch.path / "out.jsonl";
  const ProcessResult first = eval.run(out);
  REQUIRE(first.exit_code == 0);
  const std::vector<json> rows = rows_of(read_file(out));
  REQUIRE(rows.size() == 2);
  // Resuming the untouched file runs nothing and prints the first run's summary.
  const ProcessResult same = eval.run(out, {"--resume"});
  REQUIRE(same.exit_code == 0);
  CHECK(same.out == first.out);

  // Every score changed (0 to 1, anything else to 0): the summary is still the one the predictions get, and a
  // note says so.
  std::vector<json> lied = rows;
  for (json& row : lied) row["score"] = row["score"].get<double>() == 0 ? 1 : 0;
  const fs::path lying = eval.scratch.path / "lying.jsonl";
  std::ofstream(lying) << lines_of(lied);
  const ProcessResult resumed = eval.run(lying, {"--resume"});
  CAPTURE(resumed.err);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.out == first.out);
  CHECK(resumed.err.find("2 rows hold a score their prediction does not get") != std::string::npos);
  CHECK(read_file(lying) == lines_of(lied));

  // A score no metric gives is no row choreo wrote: refused at its line.
  std::vector<json> huge = rows;
  huge[1]["score"] = 1e308;
  const fs::path huge_path = eval.scratch.path / "huge.jsonl";
  std::ofstream(huge_path) << lines_of(huge);
  const ProcessResult refused = eval.run(huge_path, {"--resume"});
  CHECK(testing::ended_cleanly(refused));
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("huge.jsonl:2") != std::string::npos);
  CHECK(refused.err.find("outside 0..1") != std::string::npos);
  CHECK(refused.out.find("inf") == std::string::npos);
  CHECK(read_file(huge_path) == lines_of(huge));
}

TEST_CASE("eval --resume: rows without the models' fingerprint are refused unless --accept-old-results") {
  const TinyEval eval;
  const fs::path out = eval.scratch.path / "out.jsonl";
  const ProcessResult first = eval.run(out);
  REQUIRE(first.exit_code == 0);
  std::vector<json> old = rows_of(read_file(out));
  REQUIRE(old.size() == 2);
  old[0]["extra"].erase("models_xxh3");
  std::ofstream(out) << lines_of(old);
  const ProcessResult refused = eval.run(out, {"--resume"});
  CAPTURE(refused.err);
  CHECK(testing::ended_cleanly(refused));
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("out.jsonl:1") != std::string::npos);
  CHECK(refused.err.find("no extra.models_xxh3") != std::string::npos);
  CHECK(refused.err.find("--accept-old-results") != std::string::npos);
  CHECK(read_file(out) == lines_of(old));
  // Accepted, the file is resumed as it is: nothing to run, the first run's summary.
  const ProcessResult accepted = eval.run(out, {"--resume", "--accept-old-results"});
  CHECK(accepted.exit_code == 0);
  CHECK(accepted.out == first.out);
  CHECK(read_file(out) == lines_of(old));
}

}  // namespace choreo
