#pragma once
// What `choreo run` writes besides the terminal: the JSON record of every message (`--json`) and a
// Chrome/Perfetto trace (`--trace`; open it at ui.perfetto.dev or chrome://tracing).

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/exec/interpreter.h"

namespace choreo::exec {

/// Every message of one run (name, kind, agent, parents, text, tokens, positions, counts, timings), the
/// engine batches and the output.
nlohmann::ordered_json run_json(const RunResult& result);

/// One instance's run as it appears in a trace: a label (its process track) and its messages.
struct TracedRun {
  std::string label;
  const RunResult* result = nullptr;
};

/// A Chrome trace-event document: one process per instance, one thread track per agent (calls without an
/// agent on a track of their own), one complete event per message from submission to finish, with a nested
/// "first token" event for decodes, and the token counts as arguments; plus one counter track per agent,
/// "steps to AGENT", with its steps-to-execution after each plan step (-1: it never runs again). Times are
/// relative to the earliest submission.
nlohmann::ordered_json trace_json(const std::vector<TracedRun>& runs);

}  // namespace choreo::exec
