// `choreo run`: runs a workflow file once (docs/workflow-language.md, "Running"). Prints each decode's text
// as its batch finishes, then the workflow's output; `--json` writes every message with its timings.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <limits>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "dsl/workflow_parser.h"
#include "common/error.h"
#include "common/terminal_text.h"
#include "runtime/engine/engine.h"
#include "common/atomic_file.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/exec/baseline_count.h"
#include "runtime/exec/instances.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/run_report.h"
#include "runtime/exec/thread_room.h"
#include "cli/run_output.h"
#include "cli/stream_printer.h"
#include "runtime/engine/open_engine.h"

namespace choreo::cli {

namespace {

struct RunOptions {
  std::string workflow_path, mode = "choreo", json_path, trace_path, inputs_path;
  std::vector<std::string> inputs, params, maps;
  int concurrency = 8;
  int limit = 0;
  bool no_leak = false;
  EngineFlags engine;
  int64_t max_steps = dsl::kDefaultMaxSteps;
};

/// ANSI colour of an agent: its declared `color:` when it is a named colour, else one picked by its name.
std::string agent_colour(const dsl::Workflow& workflow, const std::string& agent) {
  static const std::map<std::string, std::string> named = {
      {"black", "30"},   {"red", "31"},  {"green", "32"}, {"yellow", "33"}, {"blue", "34"},
      {"magenta", "35"}, {"cyan", "36"}, {"white", "37"}, {"gray", "90"}};
  for (const dsl::Agent& a : workflow.agents) {
    if (a.name.value != agent || !a.color) continue;
    auto it = named.find(a.color->value);
    if (it != named.end()) return it->second;
    const std::string& hex = a.color->value;  // #rrggbb, checked by the parser
    if (hex.size() == 7 && hex[0] == '#')
      return fmt::format("38;2;{};{};{}", std::stoi(hex.substr(1, 2), nullptr, 16),
                         std::stoi(hex.substr(3, 2), nullptr, 16), std::stoi(hex.substr(5, 2), nullptr, 16));
  }
  static const char* palette[] = {"36", "33", "35", "32", "34", "31"};
  return palette[std::hash<std::string>{}(agent) % 6];
}

/// Agents' colours and model text as the terminal shows them: a terminal gets colours and escaped text
/// (common/terminal_text.h); a pipe or file gets the text exactly.
struct Colours {
  bool on;
  std::function<std::string(const std::string&)> of;
  explicit Colours(const dsl::Workflow& workflow) : on(isatty(STDOUT_FILENO) != 0) {
    of = [this, &workflow](const std::string& agent) { return on ? agent_colour(workflow, agent) : std::string(); };
  }
  std::string shown(const std::string& text) const { return on ? escape_for_terminal(text) : text; }
};

/// The JSON document `--json` writes (cli/run_output.h).
nlohmann::ordered_json document(const dsl::Workflow& workflow, const RunOptions& o, const std::string& model_path,
                                const std::vector<exec::InputRow>& rows,
                                const std::vector<exec::InstanceOutcome>& outcomes, const kv::TierStats& tiers) {
  return run_document(workflow, o.mode, o.no_leak, o.engine.tiers_json(tiers), model_path, rows, outcomes);
}

/// Writes --json and --trace (when asked for): every instance, failed ones with what they did before the
/// error, marked incomplete.
void write_outputs(const dsl::Workflow& workflow, const RunOptions& o, const std::string& model_path,
                   const std::vector<exec::InputRow>& rows, const std::vector<exec::InstanceOutcome>& outcomes,
                   const runtime::Engine& engine) {
  const kv::TierStats tiers = engine.tier_stats();
  if (!o.json_path.empty())
    write_file_atomically(o.json_path, document(workflow, o, model_path, rows, outcomes, tiers)
                                               .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                                           "\n");
  if (o.trace_path.empty()) return;
  std::vector<exec::TracedRun> traced;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    std::string name = rows.empty() ? workflow.name.value : fmt::format("row {}", rows[i].line);
    if (outcomes[i].error) name += " (incomplete)";
    traced.push_back({std::move(name), &outcomes[i].result});
  }
  write_file_atomically(o.trace_path, exec::trace_json(traced, engine.tier_events()).dump() + "\n");
}

/// The last line of a run, on stderr (stdout stays the workflow's text): what the engine computed and
/// reused, the time to the first generated token, and what a prefix-caching chat baseline would have
/// computed for the same calls (counted from the run's tokens, not run: runtime/exec/baseline_count.h).
void print_summary(const std::vector<exec::InstanceOutcome>& outcomes, const model::Vocab& vocab,
                   const kv::TierStats& tiers) {
  int64_t computed = 0, reused = 0, calls = 0;
  exec::BaselineCount baseline;
  std::optional<double> ttft_ms;
  for (const exec::InstanceOutcome& o : outcomes) {
    if (o.error) continue;
    double first = std::numeric_limits<double>::infinity();
    for (const exec::MessageRecord& m : o.result.messages) first = std::min(first, m.start_ms);
    for (const exec::MessageRecord& m : o.result.messages) {
      // Another model's messages encoded for this one were computed for this call, not reused.
      computed += m.n_computed + m.n_cross_model;
      reused += std::max(m.n_reused - m.n_cross_model, 0);
      calls += m.kind == "prefill" || m.kind == "decode";
      if (m.kind == "decode" && m.n_generated > 0) {
        const double t = m.start_ms + m.ttft_ms - first;
        ttft_ms = ttft_ms ? std::min(*ttft_ms, t) : t;
      }
    }
    const exec::BaselineCount b = exec::prefix_baseline(o.result, vocab.add_bos() ? vocab.bos() : -1);
    baseline.calls += b.calls;
    baseline.computed += b.computed;
    baseline.reused += b.reused;
  }
  std::string line = fmt::format("summary: {} calls, {} tokens computed, {} reused", calls, computed, reused);
  if (ttft_ms) line += fmt::format("; first token after {:.0f} ms", *ttft_ms);
  line += fmt::format("; a prefix-caching chat baseline would compute {} tokens", baseline.computed);
  if (computed > 0) line += fmt::format(" ({:.1f}x)", double(baseline.computed) / double(computed));
  std::fprintf(stderr, "%s\n", line.c_str());
  if (tiers.t0_evictions > 0 || tiers.t3.writes > 0 || tiers.t3.hits > 0)
    std::fprintf(stderr, "%s\n", tiers_line(tiers).c_str());
}

/// Prints an error that stopped one instance (of several) and keeps going.
void report_instance_error(const std::exception_ptr& error, int line, const std::string& inputs_path) {
  std::fprintf(stderr, "%s:%d: this row failed:\n%s", inputs_path.c_str(), line, describe_error(error).c_str());
}

/// One instance: every decode streams token by token.
std::vector<exec::InstanceOutcome> run_once(const dsl::Workflow& workflow, runtime::Engine& engine,
                                            const exec::RunArguments& arguments, const RunOptions& o,
                                            const Colours& colours) {
  StreamPrinter printer(engine.model().vocab(), colours.of, stdout);
  exec::RunHooks hooks;
  hooks.on_decode_start = [&](const std::vector<exec::DecodeBranch>& b) { printer.start(b); };
  hooks.on_token = [&](size_t branch, model::Token t) { printer.token(branch, t); };
  hooks.on_decoded = [&](const exec::MessageRecord& m) { printer.finished(m); };
  exec::InstancesOptions options;
  options.no_leak = o.no_leak;
  options.hooks = [&](size_t) { return hooks; };
  return exec::run_instances(workflow, engine, {arguments}, options);
}

/// Many instances: their calls share engine batches; each decode is printed when its batch finishes.
std::vector<exec::InstanceOutcome> run_rows(const dsl::Workflow& workflow, runtime::Engine& engine,
                                            const std::vector<exec::InputRow>& rows, const RunOptions& o,
                                            const Colours& colours) {
  std::mutex print;
  exec::InstancesOptions options;
  options.concurrency = o.concurrency;
  options.no_leak = o.no_leak;
  options.hooks = [&](size_t i) {
    exec::RunHooks hooks;
    hooks.on_decoded = [&, i](const exec::MessageRecord& m) {
      std::lock_guard lock(print);
      const std::string who = m.agent.empty() ? m.name : fmt::format("{} ({})", m.name, m.agent);
      const std::string c = colours.of(m.agent);
      const std::string title = fmt::format("── row {} · {}", rows[i].line, who);
      std::cout << (c.empty() ? title : fmt::format("\033[1;{}m{}\033[0m", c, title)) << "\n"
                << colours.shown(m.text) << "\n\n" << std::flush;
    };
    return hooks;
  };
  std::vector<exec::RunArguments> all;
  for (const exec::InputRow& r : rows) all.push_back(r.arguments);
  return exec::run_instances(workflow, engine, all, options);
}

/// Prints each row's output (or its error); returns how many rows failed.
int print_row_outputs(const dsl::Workflow& workflow, const std::vector<exec::InputRow>& rows,
                      const std::vector<exec::InstanceOutcome>& outcomes, const RunOptions& o,
                      const Colours& colours) {
  int failed = 0;
  for (size_t i = 0; i < outcomes.size() && !rows.empty(); ++i) {
    if (outcomes[i].error) {
      ++failed;
      report_instance_error(outcomes[i].error, rows[i].line, o.inputs_path);
      continue;
    }
    if (workflow.output)
      std::cout << (colours.on ? fmt::format("\033[1m── row {} output\033[0m\n", rows[i].line)
                               : fmt::format("── row {} output\n", rows[i].line))
                << colours.shown(outcomes[i].result.output) << "\n";
  }
  return failed;
}

void run_run(const RunOptions& o) {
  const runtime::Mode mode = runtime::parse_mode(o.mode);
  exec::RunArguments arguments{key_values(o.inputs, "--input"), key_values(o.params, "--param"), o.max_steps};
  const dsl::Workflow workflow = dsl::load_workflow(o.workflow_path);
  std::vector<exec::InputRow> rows;
  if (!o.inputs_path.empty()) rows = exec::read_input_rows(o.inputs_path, workflow, arguments, key_values(o.maps, "--map"));
  if (o.limit > 0 && rows.size() > size_t(o.limit)) rows.resize(size_t(o.limit));
  if (!o.json_path.empty()) check_writable(o.json_path, "--json");
  if (!o.trace_path.empty()) check_writable(o.trace_path, "--trace");
  // The run's model (with --lora adapters) is model 0; the workflow's `models:` follow.
  runtime::ModelOptions model_options = o.engine.model_options(exec::workflow_model_path(workflow, o.engine.model_path));
  model_options.add_models = exec::workflow_models_adder(workflow);
  const std::unique_ptr<runtime::OpenedEngine> opened =
      runtime::open_engine(model_options, o.engine.engine_options(mode, StorePolicy::Default));
  runtime::Engine& engine = opened->engine();
  const std::string model_path = opened->model().file().path();

  const Colours colours(workflow);
  std::vector<exec::InstanceOutcome> outcomes;
  if (rows.empty()) {
    outcomes = run_once(workflow, engine, arguments, o, colours);
    if (outcomes[0].error) {
      write_outputs(workflow, o, model_path, rows, outcomes, engine);  // marked incomplete
      std::rethrow_exception(outcomes[0].error);
    }
    if (workflow.output)
      std::cout << (colours.on ? "\033[1m── output\033[0m\n" + colours.shown(outcomes[0].result.output) + "\n"
                               : output_block(outcomes[0].result.output))
                << std::flush;
  } else {
    outcomes = run_rows(workflow, engine, rows, o, colours);
  }
  const int failed = print_row_outputs(workflow, rows, outcomes, o, colours);
  write_outputs(workflow, o, model_path, rows, outcomes, engine);
  print_summary(outcomes, engine.model().vocab(), engine.tier_stats());
  // Memory or I/O failed, not the row's input: exit 1.
  if (std::any_of(outcomes.begin(), outcomes.end(),
                  [](const exec::InstanceOutcome& r) { return r.error && !is_input_error(r.error); }))
    throw RuntimeFailure(
        fmt::format("{} of {} rows failed (errors above), not all for their input", failed, rows.size()));
  if (failed > 0)
    throw InputError(fmt::format("{} of {} rows failed (errors above)", failed, rows.size()),
                     "the other rows ran; fix the failing rows and run them again");
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "run a workflow file once (see docs/workflow-language.md)");
  cmd->add_option("workflow", o->workflow_path, "workflow YAML file")->required();
  add_pairs_option(*cmd, "--input", o->inputs, "an input value, KEY=VALUE (repeatable)");
  add_pairs_option(*cmd, "--map", o->maps, "with --inputs: read input INPUT from row key FIELD, INPUT=FIELD (repeatable)");
  add_pairs_option(*cmd, "--param", o->params, "override a param, KEY=VALUE (repeatable)");
  cmd->add_option("--mode", o->mode,
                  "engine path: choreo (default; reuse cached parents), prefix or naive (chat-API baselines)")
      ->check(CLI::IsMember({"choreo", "prefix", "naive"}));
  cmd->add_option("--json", o->json_path,
                  "write every message (text, parents, tokens, timings) as JSON here");
  cmd->add_option("--trace", o->trace_path,
                  "write a Chrome/Perfetto trace (one track per agent) here; open it at ui.perfetto.dev");
  cmd->add_option("--inputs", o->inputs_path,
                  "run once per line of this JSON Lines file (keys naming inputs are used, others ignored)");
  cmd->add_option("--limit", o->limit, "with --inputs: run only the first N rows (default all)")
      ->check(at_least(0));
  cmd->add_option("--concurrency", o->concurrency,
                  "with --inputs: instances in flight at once; their ready calls share engine batches (default 8)")
      ->check(CLI::Range(1, exec::kMaxConcurrency));
  cmd->add_flag("--no-leak", o->no_leak,
                "re-encode parents whose encoding carries another agent's private messages (see choreo check)");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache |
                          EngineFlags::kTiers | EngineFlags::kRedis | EngineFlags::kStore |
                          EngineFlags::kRepair);
  add_max_steps_option(*cmd, o->max_steps);
  cmd->callback([o] {
    o->engine.resolve();
    run_run(*o);
  });
}

}  // namespace choreo::cli
