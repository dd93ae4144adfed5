// `choreo eval WORKFLOW.yaml --data FILE ...`: the run form of `choreo eval` (docs/eval.md, "Running a
// workflow over a dataset"). Runs every selected row in every --mode, appends one result line per (row,
// mode) as each instance finishes, shows progress on stderr, and prints the summary with the paired
// comparison of the modes at the end. The work itself is runtime/eval/run.h; this file is the command line.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "dsl/workflow_parser.h"
#include "runtime/exec/workflow_models.h"
#include "common/error.h"
#include "runtime/eval/progress.h"
#include "runtime/eval/run.h"
#include "runtime/eval/summary.h"
#include "runtime/exec/thread_room.h"
#include "runtime/engine/open_engine.h"

namespace choreo::cli {

namespace {

struct EvalRunOptions {
  std::string workflow_path, data_path, format, metric, out_path, shard = "0/1";
  std::vector<std::string> maps, modes, params;
  long limit = -1;
  int concurrency = 4;
  EngineFlags engine;
  bool resume = false, accept_old_results = false, no_leak = false, json = false, sync = false;
  int64_t max_steps = dsl::kDefaultMaxSteps;
};

std::vector<runtime::Mode> parse_modes(const std::vector<std::string>& names) {
  if (names.empty()) return {runtime::Mode::Choreo};
  std::vector<runtime::Mode> modes;
  for (const std::string& name : names) {
    const runtime::Mode mode = runtime::parse_mode(name);
    if (std::find(modes.begin(), modes.end(), mode) != modes.end())
      throw InputError(fmt::format("--mode {} is given twice", name), "give each mode once");
    modes.push_back(mode);
  }
  return modes;
}

/// The default results file: <workflow>-<data>[-shard-I-of-N].jsonl in the current directory.
std::string default_out_path(const EvalRunOptions& o, const eval::Shard& shard) {
  std::string name = std::filesystem::path(o.workflow_path).stem().string() + "-" +
                     std::filesystem::path(o.data_path).stem().string();
  if (shard.count > 1) name += fmt::format("-shard-{}-of-{}", shard.index, shard.count);
  return name + ".jsonl";
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void print_summary(const std::vector<eval::ResultRow>& rows, bool json) {
  const eval::Summary summary = eval::summarize(rows);
  if (json)
    std::cout << eval::summary_to_json(summary).dump(2) << "\n";
  else
    std::cout << eval::format_summary(summary);
  std::cout << std::flush;
}

/// The run's settings from the command line (everything but the models).
eval::EvalSettings eval_settings(const EvalRunOptions& o) {
  eval::EvalSettings settings;
  settings.modes = parse_modes(o.modes);
  settings.concurrency = o.concurrency;
  if (!o.metric.empty()) settings.metric = eval::parse_metric(o.metric);
  settings.input_map = eval::InputMap::parse(o.maps);
  settings.shared.params = key_values(o.params, "--param");
  settings.shared.max_steps = o.max_steps;
  settings.no_leak = o.no_leak;
  // The choreo engine's options; only an explicit --cache-dir (or a T2 budget) is used, so that timings
  // never depend on what was encoded before.
  const runtime::EngineOptions engine = o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::Explicit);
  settings.page_tokens = engine.page_tokens;
  settings.k_type = engine.k_type;
  settings.v_type = engine.v_type;
  settings.cache_bytes = *engine.t0_bytes;
  settings.tiers = engine.tiers;
  settings.stores = engine.stores;
  settings.repair = engine.repair;
  return settings;
}

/// Loads the run's models (-m, --lora, the workflow's `models:`) into `settings`, and refuses a results file
/// whose rows other models, KV cache types or another --repair made.
std::shared_ptr<runtime::LoadedModels> load_checked_models(const EvalRunOptions& o, const dsl::Workflow& workflow,
                                                          eval::EvalSettings& settings,
                                                          const eval::ResultsFile& existing,
                                                          const std::string& out_path) {
  runtime::ModelOptions model_options = o.engine.model_options();
  model_options.add_models = exec::workflow_models_adder(workflow);
  std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(model_options);
  settings.lora = &loaded->base_lora;
  settings.models = &loaded->models();
  eval::check_resumed_models(existing.rows, eval::models_fingerprint(loaded->model(), settings), out_path);
  return loaded;
}

/// Loads the models and runs every pending (row, mode), showing progress on stderr.
eval::EvalReport run_pending(const EvalRunOptions& o, const dsl::Workflow& workflow,
                             const std::vector<eval::PreparedRow>& rows, eval::EvalSettings settings,
                             const eval::ResultsFile& existing, const std::string& out_path, size_t n_pending,
                             eval::ResultWriter& writer) {
  const std::shared_ptr<runtime::LoadedModels> loaded = load_checked_models(o, workflow, settings, existing, out_path);
  const bool terminal = isatty(STDERR_FILENO) != 0;
  eval::Progress progress(n_pending, terminal);
  auto say = [](const std::string& text) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  };
  eval::EvalCallbacks callbacks;
  callbacks.on_mode_start = [&](runtime::Mode mode, size_t) {
    say(progress.start_mode(std::string(runtime::mode_name(mode)), now_s()));
  };
  callbacks.on_result = [&](const eval::ResultRow& r) { say(progress.finished(true, r.score, now_s())); };
  callbacks.on_failure = [&](const eval::EvalFailure& f) {
    if (terminal) say("\r\033[K");
    say(fmt::format("eval: row '{}' ({}:{}) failed in mode {}:\n{}{}", f.id, o.data_path, f.line, f.mode,
                    f.message, f.message.ends_with('\n') ? "" : "\n"));
    say(progress.finished(false, 0, now_s()));
  };
  const eval::EvalReport report =
      eval::run_eval(workflow, loaded->model(), rows, settings, eval::done_keys(existing.rows), writer, callbacks);
  say(progress.close());
  return report;
}

void run_eval_command(const EvalRunOptions& o) {
  if (o.data_path.empty())
    throw InputError(
        "choreo eval WORKFLOW.yaml needs --data FILE",
        "e.g. choreo eval workflows/madpar.yaml --data ../shared/data/math500_test.jsonl --limit 5");
  // Everything that can be wrong with the input is checked before the model is loaded.
  const eval::EvalSettings settings = eval_settings(o);
  const eval::Shard shard = eval::parse_shard(o.shard);
  const dsl::Workflow workflow = dsl::load_workflow(o.workflow_path);
  const eval::Dataset data = eval::load_dataset(
      o.data_path, o.format.empty() ? std::nullopt : std::optional(eval::parse_format(o.format)));
  const std::vector<eval::Row> selected = eval::select_rows(data.rows, o.limit, shard);
  const std::vector<eval::PreparedRow> rows = eval::prepare_rows(workflow, data, selected, settings);

  const std::string out_path = o.out_path.empty() ? default_out_path(o, shard) : o.out_path;
  const eval::ResultsFile existing = eval::read_results(out_path);
  if (!o.resume && !existing.rows.empty())
    throw InputError(fmt::format("results file '{}' already holds {} rows", out_path, existing.rows.size()),
                     "pass --resume to run only what it lacks, or choose another --out");
  if (!o.accept_old_results) eval::require_fingerprints(existing, out_path);
  if (existing.truncated_tail)
    std::fprintf(stderr, "note: %s: the last line was cut off (a killed run); it is dropped and run again\n",
                 out_path.c_str());
  const size_t n_pending = eval::count_pending(rows, settings.modes, eval::done_keys(existing.rows));
  eval::ResultWriter writer(out_path, o.sync);

  std::string mode_list;
  for (runtime::Mode m : settings.modes)
    mode_list += (mode_list.empty() ? "" : ", ") + std::string(runtime::mode_name(m));
  std::fprintf(stderr, "eval: %s on %zu rows of %s (%s) in %s → %s; %zu runs to do, %zu already there\n",
               workflow.name.value.c_str(), rows.size(), o.data_path.c_str(),
               std::string(eval::format_name(data.format)).c_str(), mode_list.c_str(), out_path.c_str(),
               n_pending, rows.size() * settings.modes.size() - n_pending);
  if (settings.stores.disk_dir)
    std::fprintf(stderr, "eval: choreo mode reads encodings from the store %s\n", settings.stores.disk_dir->c_str());
  // With nothing to run, the file is still checked against this run's models before it is summarised as
  // this run's.
  eval::EvalReport report;
  if (n_pending > 0) {
    report = run_pending(o, workflow, rows, settings, existing, out_path, n_pending, writer);
  } else if (!existing.rows.empty()) {
    eval::EvalSettings checked = settings;
    load_checked_models(o, workflow, checked, existing, out_path);
  }

  // The summary covers this selection as the file now holds it: resumed rows and new ones alike, each
  // scored again from its prediction.
  size_t n_rescored = 0;
  const std::vector<eval::ResultRow> selection =
      eval::results_of_selection(eval::read_results(out_path).rows, rows, settings.modes, &n_rescored);
  if (n_rescored > 0)
    std::fprintf(stderr,
                 "note: %s: %zu rows hold a score their prediction does not get; the summary uses the score "
                 "computed again\n",
                 out_path.c_str(), n_rescored);
  print_summary(selection, o.json);
  if (!report.failures.empty())
    throw InputError(fmt::format("{} of {} runs failed (errors above); nothing was written for them",
                                 report.failures.size(), report.n_run),
                     "fix the cause, then run the same command with --resume to run only those");
}

}  // namespace

void add_eval_run(CLI::App& eval_group) {
  auto o = std::make_shared<EvalRunOptions>();
  CLI::App& cmd = eval_group;
  cmd.add_option("workflow", o->workflow_path, "workflow YAML file to run over the data (the run form)");
  cmd.add_option("--data", o->data_path,
                 "data file: MATH jsonl, LongBench jsonl, the MuSiQue json, or jsonl");
  cmd.add_option("--format", o->format, "math, longbench, musique or jsonl (default: detected)");
  add_pairs_option(cmd, "--map", o->maps, "feed a row field to a workflow input, INPUT=FIELD (repeatable)");
  cmd.add_option("--limit", o->limit, "use the first N rows (default: all)")->check(at_least(0));
  cmd.add_option("--shard", o->shard, "run slice I of N of the (limited) rows: row index mod N == I");
  add_pairs_option(cmd, "--mode", o->modes, "choreo, prefix or naive; repeat for a paired comparison (default choreo)");
  cmd.add_option("--metric", o->metric,
                 "math, qa_f1, rouge_l, classification, retrieval or count "
                 "(default: the dataset's)");
  cmd.add_option("--concurrency", o->concurrency,
                 "rows in flight at once per mode; their calls share batches "
                 "(default 4)")
      ->check(CLI::Range(1, exec::kMaxConcurrency));
  cmd.add_option("--out", o->out_path,
                 "results file, one JSON line per (row, mode) "
                 "(default: WORKFLOW-DATA[-shard-I-of-N].jsonl)");
  cmd.add_flag("--resume", o->resume,
               "keep the rows already in --out and run only the missing (row, mode) pairs");
  cmd.add_flag("--accept-old-results", o->accept_old_results,
               "with --resume: keep rows without the models' fingerprint (files of older versions), "
               "trusting that this run's models made them");
  add_pairs_option(cmd, "--param", o->params, "override a workflow param for every row, KEY=VALUE (repeatable)");
  cmd.add_flag("--no-leak", o->no_leak, "re-encode parents carrying other agents' private messages");
  o->engine.add(cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache |
                        EngineFlags::kTiers | EngineFlags::kRedis | EngineFlags::kStore |
                        EngineFlags::kRepair);
  add_max_steps_option(cmd, o->max_steps);
  cmd.add_flag("--json", o->json, "print the closing summary as JSON");
  cmd.add_flag("--fsync", o->sync,
               "fsync the results file after every row (survives power loss, not only kills)");
  cmd.callback([o, &cmd] {
    if (!cmd.get_subcommands().empty()) return;  // `eval score` / `eval merge` ran instead
    if (o->workflow_path.empty())
      throw InputError(
          "choreo eval needs a workflow file or a subcommand",
          "choreo eval WORKFLOW.yaml --data FILE ..., choreo eval score ..., or choreo eval merge ...");
    o->engine.resolve();
    run_eval_command(*o);
  });
}

}  // namespace choreo::cli
