// `choreo exec`: drives the Prompt Choreography engine from a JSONL calls file (docs/exec.md), one result
// line per call on stdout. The whole file is validated before the model runs anything.

#include <cstdio>
#include <fstream>
#include <iostream>

#include "cli/common.h"
#include "runtime/common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/calls.h"
#include "runtime/kv/page_pool.h"

namespace choreo::cli {

namespace {

struct ExecOptions {
  std::string model_path, calls_path, mode = "choreo";
  int n_threads = 0;
  int cache_mib = 4096;
  int page_tokens = 32;
};

void run_exec(const ExecOptions& o) {
  const runtime::Mode mode = runtime::parse_mode(o.mode);
  std::ifstream file;
  const bool from_stdin = o.calls_path == "-";
  if (!from_stdin) {
    file.open(o.calls_path, std::ios::binary);
    if (!file)
      throw InputError(fmt::format("cannot open calls file '{}'", o.calls_path),
                       "pass a JSONL file of calls, or - to read them from stdin");
  }
  LoadedModel lm = load_model(o.model_path, o.n_threads);
  kv::PagePool pool(lm.model->kv_layout(o.page_tokens), size_t(o.cache_mib) << 20);
  runtime::Engine engine(*lm.model, pool, mode);
  exec::run_calls(from_stdin ? std::cin : file, from_stdin ? "<stdin>" : o.calls_path, engine, std::cout);
}

}  // namespace

void register_exec(CLI::App& app) {
  auto o = std::make_shared<ExecOptions>();
  CLI::App* cmd = app.add_subcommand("exec", "run prefill/decode calls from a JSONL file (see docs/exec.md)");
  add_model_options(*cmd, o->model_path, o->n_threads);
  cmd->add_option("calls", o->calls_path, "JSONL file of calls, or - for stdin")->required();
  cmd->add_option("--mode", o->mode,
                  "engine path: choreo (default; reuse cached parents), prefix or naive (chat-API baselines)")
      ->check(CLI::IsMember({"choreo", "prefix", "naive"}));
  cmd->add_option("--cache-mib", o->cache_mib, "KV page pool budget in MiB (default 4096)")
      ->check(at_least(1));
  add_page_tokens_option(*cmd, o->page_tokens);
  cmd->callback([o] { run_exec(*o); });
}

}  // namespace choreo::cli
