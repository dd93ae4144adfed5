// `choreo serve` with real clients on 127.0.0.1: each case runs one section of tests/serve/serve_clients.py
// (the openai and anthropic packages, LangGraph, raw sockets) against the choreo binary beside this test
// binary, on the default model. A section prints each check it makes; the first one that fails ends it.

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "tests/cli_process.h"
#include "tests/reference/reference.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

void run_section(const std::string& section) {
  const std::string binary = testing::choreo_binary();
  REQUIRE_MESSAGE(std::filesystem::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
  const std::string model = testing::require_file(testing::default_model());
  testing::ScratchDir scratch;
  testing::ProcessOptions options;
  options.timeout_seconds = 600;
  const testing::ProcessResult r = testing::run_process(
      testing::python_exe(),
      {testing::source_file("tests/serve/serve_clients.py").string(), section, "--choreo", binary, "--model", model},
      scratch.path, options);
  MESSAGE(r.out);
  REQUIRE_MESSAGE(r.exited, "the client script was killed (signal ", r.signal, r.timed_out ? ", timed out)" : ")");
  CHECK_MESSAGE(r.exit_code == 0, "section ", section, " failed: ", r.err.substr(r.err.size() > 4000 ? r.err.size() - 4000 : 0));
}

TEST_CASE("serve: the openai package against choreo serve (chat streamed and not, n, stop, cached_tokens, responses, typed errors)") {
  run_section("openai");
}

TEST_CASE("serve: the anthropic package against choreo serve (cache_control, cache reads, streamed events)") {
  run_section("anthropic");
}

TEST_CASE("serve: 32 concurrent clients each get the text choreo generate --chat gives alone") {
  run_section("equality");
}

TEST_CASE("serve: bad input and faulty clients get clear errors and the server keeps serving") {
  run_section("faults");
}

TEST_CASE("serve: a LangGraph debate of three agents hits the cache and is the same on a restarted server") {
  run_section("langgraph");
}

TEST_CASE("serve: choreo's extensions give choreo exec's text and typed errors for unknown ids and conflicts and "
          "cycles") {
  run_section("extensions");
}

TEST_CASE("serve: served messages move through T1, survive kill -9 in T2, are shared through T3, and keep their bits") {
  run_section("tiers");
}

TEST_CASE("serve: a workflow run over HTTP streams what choreo run prints and ends with its --json record") {
  run_section("workflows");
}

}  // namespace
}  // namespace choreo
