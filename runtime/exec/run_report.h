#pragma once
// What `choreo run` writes besides the terminal: the JSON record of every message (`--json`) and a
// Chrome/Perfetto trace (`--trace`; open it at ui.perfetto.dev or chrome://tracing).

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "runtime/exec/interpreter.h"
#include "runtime/kv/tiers.h"

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
/// "steps to AGENT", with its steps-to-execution after each plan step (-1: it never runs again). The engine's
/// tier events (Engine::tier_events) make one more process, "KV tiers", with one track per kind of transfer
/// ("evict to T1", "T2->T0", "T1->T0 prefetch", "write T3", "recompute", ...) and one complete event per transfer
/// (message, tokens, bytes as arguments). Times are relative to the earliest event.
nlohmann::ordered_json trace_json(const std::vector<TracedRun>& runs, std::span<const kv::TierEvent> tier_events = {});

}  // namespace choreo::exec
