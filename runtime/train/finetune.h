#pragma once
// `choreo finetune` (issue 13, DESIGN.md §9): baseline traces of a workflow, and the choreographed run of a
// trace, teacher-forced, as a differentiable graph (runtime/train/graph.h) whose loss is the log-loss of the
// trace's generated tokens.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsl/workflow.h"
#include "runtime/engine/engine.h"
#include "runtime/eval/results.h"
#include "runtime/exec/instances.h"
#include "runtime/train/graph.h"

namespace choreo::train {

/// One decode of a baseline run: its bound name and the tokens it generated.
struct TraceCall {
  std::string name;
  std::vector<int32_t> generated;
  bool operator==(const TraceCall&) const = default;
};

/// One row's baseline run: the inputs file's line, the run's arguments, and its decodes in the order they ran.
struct Trace {
  int line = 0;
  exec::RunArguments arguments;
  std::vector<TraceCall> calls;
};

/// A trace as one line of a traces file.
nlohmann::json trace_json(const Trace& trace);
/// Traces files as trace_json writes them: an object's keys in order, so each line starts `{"calls":`.
inline const eval::AppendedLines kTraceLines{"traces file", {R"({"calls":)"}};

/// Reads a traces file (JSON Lines). InputError at path:line:col for a line that is not a trace (a missing
/// or mistyped field, a token outside [0, n_vocab)), and for a file with no trace.
std::vector<Trace> read_traces(const std::string& path, int n_vocab);

/// Samples one row's baseline trace: `workflow` run on `engine` (a `prefix`-mode engine for the paper's
/// baseline) with every decode at `temperature`, seeded by (seed, line, decode name).
Trace sample_trace(const dsl::Workflow& workflow, runtime::Engine& engine, const exec::InputRow& row,
                   float temperature, uint64_t seed);

/// The messages of the run of `trace`: `workflow` run on `engine` (on the base model) with every decode
/// teacher-forced to the trace's tokens, each decode's generated tokens being the targets of the logits before
/// them. On a `choreo`-mode engine: every message its decodes read (their ancestors, the implicit BOS
/// included) in creation order, each over its parents at their offsets. On a `prefix` or `naive` engine (the
/// baseline): the BOS, then one message per decode holding its flat chat prompt (its parents' text in list
/// order, its header) and what it generated. InputError when the trace does not match the workflow: a decode
/// the trace lacks, a traced call the run never made, or another number of calls.
std::vector<GraphMessage> trace_messages(const dsl::Workflow& workflow, runtime::Engine& engine, const Trace& trace);

}  // namespace choreo::train
