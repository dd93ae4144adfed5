// `--trace` and `--json` documents (runtime/exec/run_report.h), checked against runs built by hand.

#include "runtime/exec/run_report.h"

#include <doctest/doctest.h>

namespace choreo::exec {
namespace {

MessageRecord record(const std::string& name, const std::string& kind, const std::string& agent, double start_ms,
                     double total_ms, int generated) {
  MessageRecord m;
  m.name = name;
  m.kind = kind;
  m.agent = agent;
  m.start_ms = start_ms;
  m.total_ms = total_ms;
  m.ttft_ms = kind == "decode" ? total_ms / 4 : total_ms;
  m.n_generated = generated;
  m.tokens.assign(size_t(3 + generated), 7);
  return m;
}

TEST_CASE("trace: a process per instance, a track per agent, a slice per message, times from the first start") {
  RunResult a, b;
  a.messages = {record("rules", "message", "", 1000, 5, 0), record("plan", "decode", "alice", 1005, 40, 12),
                record("reply", "decode", "bob", 1045, 20, 0)};
  b.messages = {record("rules", "message", "", 1002, 1, 0), record("plan", "decode", "alice", 1003, 30, 8)};
  const nlohmann::ordered_json trace = trace_json({{"row 1", &a}, {"row 2", &b}});
  int processes = 0, threads = 0, slices = 0, first_tokens = 0;
  double earliest = 1e300;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++processes;
    if (e["ph"] == "M" && e["name"] == "thread_name") ++threads;
    if (e["ph"] != "X") continue;
    earliest = std::min(earliest, e["ts"].get<double>());
    if (e["cat"] == "ttft") {
      ++first_tokens;
    } else {
      ++slices;
    }
    if (e["name"] == "plan" && e["pid"] == 0) {
      CHECK(e["ts"].get<double>() == doctest::Approx(5000.0));  // µs after the first submission
      CHECK(e["dur"].get<double>() == doctest::Approx(40000.0));
      CHECK(e["args"]["generated"] == 12);
    }
  }
  CHECK(processes == 2);
  CHECK(threads == 3 + 2);  // (no agent), alice, bob in row 1; (no agent), alice in row 2
  CHECK(slices == 5);
  CHECK(first_tokens == 2);  // decodes that generated something
  CHECK(earliest == 0.0);
}

TEST_CASE("run json: every message with its fields, the batches and the output") {
  RunResult r;
  r.messages = {record("q", "prefill", "", 0, 1, 0), record("a", "decode", "x", 1, 2, 4)};
  r.messages[1].parents = {"q"};
  r.messages[1].stop_reason = "eog";
  r.batches = {{"prefill", 1}, {"decode", 1}};
  r.output = "done";
  const nlohmann::ordered_json j = run_json(r);
  REQUIRE(j["messages"].size() == 2);
  CHECK(j["messages"][0].contains("stop_reason") == false);
  CHECK(j["messages"][1]["parents"] == nlohmann::json::array({"q"}));
  CHECK(j["messages"][1]["n_generated"] == 4);
  CHECK(j["batches"][1]["kind"] == "decode");
  CHECK(j["output"] == "done");
}

}  // namespace
}  // namespace choreo::exec
