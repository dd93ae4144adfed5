// Bad command lines given to the real `choreo` binary: each one exits with code 2 (never a signal), names the
// problem on stderr, and writes nothing to stdout or to the output file it was asked for. Numbers out of
// range once crashed the binary (-t 100000, encode --page-tokens 0); the library checks the same bounds.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "common/error.h"
#include "tests/scratch_dir.h"
#include "tests/cli_process.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

using Scratch = testing::ScratchDir;

struct BadCall {
  std::vector<std::string> args;
  std::string expected;  // a piece of the error message
};

TEST_CASE("bad command lines exit 2 with a message and write nothing") {
  const std::string binary = testing::choreo_binary();
  REQUIRE_MESSAGE(fs::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
  Scratch scratch;
  const std::string model = testing::shared_file("models/stories260K.gguf");
  const std::string not_gguf = (scratch.path / "notes.txt").string();
  std::ofstream(not_gguf) << "these are not weights\n";
  const std::string schema = (scratch.path / "s.pml").string();
  std::ofstream(schema) << "<schema name=\"s\"><module name=\"m\">Once upon a time</module></schema>\n";
  const std::string workflow = (scratch.path / "w.yaml").string();
  std::ofstream(workflow) << "name: w\nmessages:\n  a: {text: \"Once upon a time\"}\n"
                             "steps:\n  - decode: {as: b, parents: [a], header: \"There\", max_tokens: 2}\n";
  const std::string output = (scratch.path / "out.gguf").string();
  const std::string rows = (scratch.path / "rows.jsonl").string();
  std::ofstream(rows) << "{\"x\": 1e999}\n";  // well-formed JSON beyond double range (found by exec_fuzz)
  const std::string calls_file = (scratch.path / "calls.jsonl").string();
  std::ofstream(calls_file) << "{\"op\":\"prefill\",\"id\":\"a\",\"text\":\"x\",\"max_tokens\":-1e999}\n";

  const std::vector<BadCall> calls = {
      {{"generate", "-m", model, "-p", "hi", "-t", "100000"}, "--threads"},
      {{"generate", "-m", model, "-p", "hi", "-t", "-2"}, "--threads"},
      {{"generate", "-m", model, "-p", "hi", "--top-k", "-3"}, "must be at least 0, not -3"},
      {{"generate", "-m", model, "-p", "hi", "--top-k", "1.5"}, "'1.5' is not a whole number"},
      {{"generate", "-m", model, "-p", "hi", "--top-p", "2"}, "--top-p"},
      {{"generate", "-m", model, "-p", "hi", "--temp", "-1"}, "--temp"},
      {{"generate", "-m", model, "-p", "hi", "-n", "-5"}, "must be at least -1"},
      {{"generate", "-m", (scratch.path / "missing.gguf").string(), "-p", "hi"}, "does not exist"},
      {{"generate", "-m", not_gguf, "-p", "hi"}, "not a GGUF file"},
      {{"tokenize", "-m", model}, "--prompt is required"},
      {{"model", "info", not_gguf}, "not a GGUF file"},
      {{"model", "synth", "--shape", "nope", "--type", "q8_0", "-o", output}, "unknown shape 'nope'"},
      {{"model", "synth", "--shape", "smollm2-135m", "--type", "q5_k", "-o", output}, "unknown weight type"},
      {{"bench", "-m", model, "-p", "0", "-n", "0"}, "nothing to measure"},
      {{"bench", "-m", model, "-b", "0"}, "must be at least 1, not 0"},
      {{"encode", schema, "-m", model, "--no-store", "--page-tokens", "0"}, "--page-tokens"},
      {{"encode", schema, "-m", model, "--no-store", "--cache-mib", "-5"}, "must be at least 1, not -5"},
      {{"encode", schema, "-m", model, "--no-store", "-n", "0", "-p", "x"}, "must be at least 1, not 0"},
      {{"run", workflow, "-m", model, "--page-tokens", "0"}, "--page-tokens"},
      {{"run", workflow, "-m", model, "--concurrency", "0"}, "--concurrency"},
      {{"eval", workflow, "--data", not_gguf, "--limit", "-1"}, "must be at least 0, not -1"},
      {{"run", workflow, "-m", model, "--inputs", rows}, "number overflow"},
      {{"eval", workflow, "--data", rows, "--format", "jsonl"}, "number overflow"},
      {{"exec", "-m", model, calls_file}, "calls.jsonl:1:"},
  };
  for (const BadCall& call : calls) {
    std::string line;
    for (const std::string& a : call.args) line += a + " ";
    CAPTURE(line);
    const testing::ProcessResult r = testing::run_process(binary, call.args, scratch.path);
    CAPTURE(r.err);
    CHECK(r.exited);
    CHECK(r.signal == 0);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(call.expected) != std::string::npos);
    CHECK(r.out.empty());
    CHECK_FALSE(fs::exists(output));
  }
}

TEST_CASE("the library refuses the same out-of-range numbers with an InputError") {
  CHECK_THROWS_AS(kernels::make_cpu_backend(kernels::kMaxThreads + 1), InputError);
  CHECK(kernels::make_cpu_backend(0)->threads() >= 1);
  const model::Model& m = *testing::stories260k().model;
  CHECK_THROWS_AS(m.kv_layout(0), InputError);
  CHECK_THROWS_AS(m.kv_layout(-4), InputError);
  CHECK(m.kv_layout(16).page_tokens == 16);
}

}  // namespace
}  // namespace choreo
