// `choreo exec`: drives the Prompt Choreography engine from a JSONL calls file (docs/exec.md), one result
// line per call on stdout. The whole file is validated before the model runs anything.

#include <cstdio>
#include <sstream>
#include <iostream>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "common/input_file.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/calls.h"
#include "runtime/exec/reuse_plan_file.h"
#include "runtime/engine/open_engine.h"

namespace choreo::cli {

namespace {

struct ExecOptions {
  std::string calls_path, mode = "choreo";
  EngineFlags engine;
  std::vector<std::string> lora_modules;  // NAME=ADAPTER.gguf: the run's model with that adapter
  std::vector<std::string> model_files;   // NAME=MODEL.gguf: another GGUF of the same architecture
  std::vector<std::string> reuse_plans;   // plan files of `choreo profile reuse`
};

/// After the run's model (with --lora) as "default": --lora-modules and --model-file, which calls choose with
/// their "model" field.
void add_exec_models(const ExecOptions& o, const model::Model& base, runtime::ModelSet& set,
                     runtime::ExtraModels& extra) {
  add_named_models(o.lora_modules, o.model_files, base, set, extra);
  // Plan files bind to models by fingerprint: every model with the receiver's reads every model with the
  // sender's through the plan.
  for (const std::string& path : o.reuse_plans) {
    const exec::ReusePlanFile file = exec::read_reuse_plan(path);
    int receivers = 0, senders = 0;
    for (size_t i = 0; i < set.size(); ++i)
      if (set[i].fingerprint == file.receiver) {
        ++receivers;
        senders += exec::apply_reuse_plan(set, file, int(i));
      }
    if (receivers == 0)
      throw InputError(fmt::format("--reuse-plan {}: the plan was profiled for the receiver {}, which no model "
                                   "of this run is", path, file.receiver_spec),
                       "give that model with -m/--lora, --lora-modules or --model-file (same file, adapters and "
                       "scales), or profile this pair: choreo profile reuse");
    if (senders == 0)
      throw InputError(fmt::format("--reuse-plan {}: the plan reads the sender {}, which no other model of this "
                                   "run is", path, file.sender_spec),
                       "give that model with -m/--lora, --lora-modules or --model-file");
  }
}

void run_exec(const ExecOptions& o) {
  const runtime::Mode mode = runtime::parse_mode(o.mode);
  // Every call is validated before anything runs, so the input is read whole: bounded by the input limit.
  const bool from_stdin = o.calls_path == "-";
  std::istringstream calls(read_input_file(from_stdin ? "/dev/stdin" : o.calls_path,
                                           from_stdin ? "calls input" : "calls file", input_policy().file_bytes));
  runtime::ModelOptions models = o.engine.model_options();
  models.add_models = [&o](const model::Model& base, runtime::ModelSet& set, runtime::ExtraModels& extra) {
    add_exec_models(o, base, set, extra);
  };
  const std::unique_ptr<runtime::OpenedEngine> opened =
      runtime::open_engine(models, o.engine.engine_options(mode, StorePolicy::Explicit));
  exec::run_calls(calls, from_stdin ? "<stdin>" : o.calls_path, opened->engine(), std::cout);
}

}  // namespace

void register_exec(CLI::App& app) {
  auto o = std::make_shared<ExecOptions>();
  CLI::App* cmd = app.add_subcommand("exec", "run prefill/decode calls from a JSONL file (see docs/exec.md)");
  cmd->add_option("calls", o->calls_path, "JSONL file of calls, or - for stdin")->required();
  cmd->add_option("--mode", o->mode,
                  "engine path: choreo (default; reuse cached parents), prefix or naive (chat-API baselines)")
      ->check(CLI::IsMember({"choreo", "prefix", "naive"}));
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache |
                          EngineFlags::kTiers | EngineFlags::kRedis | EngineFlags::kStore |
                          EngineFlags::kRepair);
  add_named_model_flags(*cmd, o->lora_modules, o->model_files, "\"model\":");
  cmd->add_option("--reuse-plan", o->reuse_plans,
                  "plan.json from `choreo profile reuse`: the models with its receiver's weights and adapters "
                  "read those with its sender's through its plan (default: recompute); repeatable")
      ->check(CLI::ExistingFile);
  cmd->callback([o] {
    o->engine.resolve();
    run_exec(*o);
  });
}

}  // namespace choreo::cli
