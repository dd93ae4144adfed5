#pragma once
// `choreo finetune` (issue 13, DESIGN.md §9): baseline traces of a workflow, and the choreographed run of a
// trace, teacher-forced, as a differentiable graph (runtime/train/graph.h) whose loss is the log-loss of the
// trace's generated tokens.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsl/workflow.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/open_engine.h"
#include "runtime/eval/results.h"
#include "runtime/eval/selection.h"
#include "runtime/exec/instances.h"
#include "runtime/train/graph.h"

namespace choreo::train {

/// Loads a workflow that finetune can run: one model (the run's). InputError for one that declares `models:`.
dsl::Workflow load_single_model_workflow(const std::string& path);

/// An engine over the base model alone with a T0 of 2 GiB (within the device): a traces row, or the
/// structure of one trace's run.
std::unique_ptr<runtime::OpenedEngine> open_scratch_engine(std::shared_ptr<const runtime::LoadedModels> models,
                                                           runtime::Mode mode);

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

/// One row of sample_traces done: its trace written, or its error (nothing written for it).
struct SampledRow {
  int line = 0;            // in the inputs file
  size_t done = 0, n_rows = 0;  // rows done so far (skipped ones included) of the shard's
  const Trace* trace = nullptr;       // null when the row failed
  const InputError* error = nullptr;  // null when it did not
  double seconds = 0;                 // since sampling began
};

/// What sample_traces samples, from what, and where it writes.
struct SampleTracesOptions {
  runtime::ModelOptions models;
  std::string workflow_path;  // one model (load_single_model_workflow)
  std::string inputs_path;    // rows of inputs, one JSON object per line
  exec::RunArguments shared;  // inputs and parameters every row shares (a row's own inputs win)
  std::string out_path;       // traces, JSON Lines, appended to: rows already in it are skipped
  long limit = -1;            // the first rows only (-1: all), before the shard
  eval::Shard shard;
  float temperature = 1.0f;
  uint64_t seed = 0;
  std::function<void(const SampledRow&)> on_row;  // after each row sampled or failed
};

/// What sample_traces did with the shard's rows.
struct SampleTracesReport {
  size_t n_rows = 0, written = 0, skipped = 0, failed = 0;
};

/// Samples the baseline trace of every row of the shard not yet in the output (a torn last line there is cut
/// off and sampled again), each on a fresh prefix-mode engine, as sample_trace. A row whose run fails is
/// reported to on_row and not written, so that running again retries it; the others go on. InputError for
/// bad options, workflow, inputs or output.
SampleTracesReport sample_traces(const SampleTracesOptions& options);

/// The messages of the run of `trace`: `workflow` run on `engine` (on the base model) with every decode
/// teacher-forced to the trace's tokens, each decode's generated tokens being the targets of the logits before
/// them. On a `choreo`-mode engine: every message its decodes read (their ancestors, the implicit BOS
/// included) in creation order, each over its parents at their offsets. On a `prefix` or `naive` engine (the
/// baseline): the BOS, then one message per decode holding its flat chat prompt (its parents' text in list
/// order, its header) and what it generated. InputError when the trace does not match the workflow: a decode
/// the trace lacks, a traced call the run never made, or another number of calls.
std::vector<GraphMessage> trace_messages(const dsl::Workflow& workflow, runtime::Engine& engine, const Trace& trace);

}  // namespace choreo::train
