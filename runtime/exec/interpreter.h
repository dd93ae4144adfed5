#pragma once
// The workflow interpreter: runs a parsed dsl::Workflow on a runtime::Engine for one set of inputs
// (docs/workflow-language.md). It compiles the workflow's plan (dsl/plan/plan.h) with the run's arguments and
// executes it through the one elaborator (dsl/plan/elaborate.h): static messages are prefilled in one batch,
// steps run in file order, each `for` fan-out is one batched engine call, and every batch is checked against
// the plan's step of the same name, parents, offsets and agents (exec/plan_follower.h).

#include <functional>
#include <stdexcept>
#include <map>
#include <string>
#include <vector>

#include "dsl/budget.h"
#include "dsl/plan/plan.h"
#include "dsl/workflow.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/call_sink.h"

namespace choreo::exec {

/// Values given on the command line for one run: `--input k=v` and `--param k=v`, as written, and the run's
/// work bound (`--max-steps`: loop iterations and calls, dsl/budget.h). The plan is compiled from the same.
using RunArguments = dsl::plan::Arguments;

/// One message the run created: a static message, a prefill or a decode.
struct MessageRecord {
  std::string name;  ///< the bound name, with indices (`answer[1][2]`)
  std::string kind;  ///< "message", "prefill", "decode", or "module" (a PML module this run encoded or loaded)
  kv::MessageId id = kv::kNoMessage;
  std::string agent;
  bool is_private = false;
  std::vector<std::string> parents;  ///< the parents' names, in placement order
  std::vector<std::optional<int>> parent_at;  ///< each parent's requested position (`at:`, a PML piece's own)
  std::string text;                  ///< the rendered text (message, prefill) or the generated text (decode)
  std::string stop_reason;           ///< decodes: "eog", "stop" or "length"
  std::vector<model::Token> tokens;  ///< the message's tokens (a decode: header, then the generated tokens)
  int n_generated = 0;               ///< decodes: generated tokens (the tail of `tokens`)
  int start_pos = 0;
  int n_computed = 0;
  int n_reused = 0;
  int n_loaded = 0;       ///< parent tokens loaded back from T1 before the call ran (runtime/kv/tiers.h)
  int n_recomputed = 0;   ///< parent tokens recomputed because no tier held them
  int n_cross_model = 0;  ///< parent tokens another model encoded, encoded by this call's model first
  int n_repaired = 0;     ///< parent tokens its repair policy recomputed (runtime::CallStats; in n_computed)
  std::string model;      ///< the model it ran on: a name under `models:`, or "" for the run's model
  double load_ms = 0;     ///< time spent on both
  double ttft_ms = 0;
  double total_ms = 0;
  double start_ms = 0;  ///< when its batch was submitted, on the steady clock (steady_ms(), common/clock.h)
  std::vector<std::vector<float>> logits;  ///< decodes with RunHooks::record_logits: each step's logits
};

/// One engine call the interpreter issued: a prefill_batch or decode_batch of `size` requests.
struct BatchRecord {
  std::string kind;  ///< "prefill" or "decode"
  int size = 0;
};

/// Every agent's steps-to-execution (dsl/plan/steps_to_execution.h) at one moment of a run: before its first
/// step, and after each plan step completes. `--trace` draws them as one counter track per agent.
struct StepSample {
  double ms = 0;                    ///< when, on the steady clock (steady_ms(), common/clock.h)
  std::optional<size_t> completed;  ///< the plan step that just completed (none: before the first)
  std::vector<std::pair<std::string, std::optional<size_t>>> agents;  ///< nullopt: never runs again
};

/// What a run produced: every message in creation order, the engine batches, and the rendered output.
struct RunResult {
  std::vector<MessageRecord> messages;
  std::vector<BatchRecord> batches;
  std::string output;
  std::vector<StepSample> steps;
};

/// A decode about to run, as streaming hooks see it.
struct DecodeBranch {
  std::string name;
  std::string agent;
  std::vector<std::string> stop;  ///< its stop strings (the final text ends before the first one)
};

/// Hooks a caller may set. `on_decoded` is called for each decode as soon as its batch finishes.
/// `on_decode_start` and `on_token` stream a batch as it is generated (token by token, on the engine's
/// thread); `exact_tokens`, when set, forces a decode (by its bound name) to generate exactly that many
/// tokens, ignoring EOG and stop strings (`choreo profile`).
struct RunHooks {
  std::function<void(const MessageRecord&)> on_decoded;
  std::function<void(const std::vector<DecodeBranch>&)> on_decode_start;
  std::function<void(size_t branch, model::Token token)> on_token;
  std::function<std::optional<int>(const std::string& name)> exact_tokens;
  std::function<bool(const std::string& name)> record_logits;  ///< keep this decode's logits (tests)
  /// Teacher forcing (`choreo finetune train`): a decode (by its bound name) for which this gives tokens
  /// "generates" exactly those (runtime::DecodeRequest::forced).
  std::function<std::optional<std::vector<model::Token>>(const std::string& name)> forced_tokens;
  /// Adjusts a decode's sampling (by its bound name) before it runs (`choreo finetune traces --temperature`).
  std::function<void(const std::string& name, model::SamplingParams& sampling)> sampling;
  /// A run that fails hands over what it did before the error (then the error propagates): `--json` and
  /// `--trace` still write it, marked incomplete.
  std::function<void(RunResult&& partial)> on_failure;
  /// The plan the run follows, once compiled (before the first engine call).
  std::function<void(const dsl::plan::Plan& plan)> on_plan;
  /// After each batch: the index of the plan's batch (step) it was, and the messages it created (a PML
  /// message: each of its pieces).
  std::function<void(size_t plan_batch, const std::vector<kv::MessageId>& created)> on_plan_batch;
  /// Asked before each engine batch and each decoded token: true ends the run (its decodes stop before their
  /// next token, and the run throws RunCancelled before its next batch). `choreo serve` cancels a run whose
  /// client left or that passed its time bound.
  std::function<bool()> cancelled;
};

/// What a run throws when RunHooks::cancelled said so.
struct RunCancelled : std::runtime_error {
  RunCancelled() : std::runtime_error("the workflow run was cancelled") {}
};

/// Runs `workflow` once on `engine`. Inputs without a value and unknown or mistyped `--input`/`--param`
/// keys, expression errors, unsupported constructs (PML prompts, a per-call model other than the loaded
/// one), engine errors (context overflow) and passing the work bound (at the loop or call that passes it)
/// are InputErrors, located in the workflow file where possible.
RunResult run_workflow(const dsl::Workflow& workflow, runtime::Engine& engine, const RunArguments& arguments,
                       const RunHooks& hooks = {});

/// The same, sending engine calls to `sink` (a DirectSink, or a BatchScheduler's worker sink).
RunResult run_workflow(const dsl::Workflow& workflow, CallSink& sink, const RunArguments& arguments,
                       const RunHooks& hooks = {});

}  // namespace choreo::exec
