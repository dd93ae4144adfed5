#include "runtime/eval/run.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <new>
#include <set>

#include "common/error.h"
#include "dsl/arguments.h"
#include "dsl/plan/elaborate.h"
#include "runtime/engine/model_set.h"
#include "runtime/eval/math_answer.h"
#include "runtime/exec/leak_guard.h"
#include "runtime/exec/profile.h"
#include "runtime/exec/scheduler.h"
#include "runtime/kv/page_pool.h"

namespace choreo::eval {

namespace {

/// The names a row can feed: the workflow's declared inputs and the dataset fields its messages read.
std::vector<std::string> fed_names(const dsl::Workflow& workflow) {
  std::vector<std::string> names;
  for (const dsl::Input& input : workflow.inputs) names.push_back(input.name.value);
  for (const dsl::Message& message : workflow.messages)
    if (message.field && std::find(names.begin(), names.end(), message.field->value) == names.end())
      names.push_back(message.field->value);
  return names;
}

/// `--param` keys must be params of the workflow and convert to their types; checked once, not per row.
void check_params(const dsl::Workflow& workflow, const exec::RunArguments& shared) {
  for (const auto& [key, text] : shared.params) {
    const std::string& name = key;  // clang 14 cannot capture a structured binding
    auto it = std::find_if(workflow.params.begin(), workflow.params.end(),
                           [&](const dsl::Param& p) { return p.name.value == name; });
    if (it == workflow.params.end()) {
      std::vector<std::string> names;
      for (const dsl::Param& p : workflow.params) names.push_back(p.name.value);
      throw InputError(
          fmt::format("--param {}: workflow `{}` has no param `{}`", key, workflow.name.value, key),
          names.empty() ? "this workflow declares no params"
                        : fmt::format("its params are: {}", fmt::join(names, ", ")));
    }
    dsl::convert_argument(text, it->value.type, fmt::format("param `{}`", key));
  }
}

/// An error about one row, re-located at the row's line of the data file.
[[noreturn]] void fail_row(const InputError& error, const Row& row, const std::string& data_path) {
  throw InputError(fmt::format("row '{}': {}", row.id, error.message()), error.hint(),
                   SourceLocation{data_path, row.line, 0});
}

Metric metric_of(const Row& row, const Dataset& data, const EvalSettings& settings) {
  if (settings.metric) return *settings.metric;
  if (!row.dataset.empty())
    if (std::optional<Metric> m = metric_for_dataset(row.dataset)) return *m;
  if (data.metric) return *data.metric;
  throw InputError(
      fmt::format("no metric for the rows of '{}' ({} format)", data.path, format_name(data.format)),
      "pass --metric math|qa_f1|rouge_l|classification|retrieval|count",
      SourceLocation{data.path, row.line, 0});
}

ScoreContext context_of(const Row& row) { return ScoreContext{row.gold, row.all_classes, row.dataset}; }

/// What MATH scores: a workflow's output that holds no \boxed{} is the answer itself, already extracted
/// (madpar's `output: "{{ boxed(...) }}"`), so it is scored as if boxed. An output with a box, or empty, is
/// scored as the official rule says.
std::string scored_text(Metric metric, const std::string& prediction) {
  if (metric != Metric::math || prediction.empty() || last_boxed_only_string(prediction)) return prediction;
  return "\\boxed{" + prediction + "}";
}

}  // namespace

std::vector<PreparedRow> prepare_rows(const dsl::Workflow& workflow, const Dataset& data,
                                      const std::vector<Row>& rows, const EvalSettings& settings) {
  if (!workflow.output)
    throw InputError(fmt::format("workflow `{}` has no `output:`", workflow.name.value),
                     "choreo eval scores the workflow's output; add e.g. output: \"{{ answer }}\"",
                     workflow.name.where, workflow.source_line(workflow.name.where.line));
  check_params(workflow, settings.shared);
  const std::vector<std::string> names = fed_names(workflow);
  std::vector<PreparedRow> out;
  for (const Row& row : rows) {
    PreparedRow p;
    p.row = &row;
    p.arguments.inputs = settings.input_map.apply(row, names, data.path);
    p.arguments.params = settings.shared.params;
    p.arguments.max_steps = settings.shared.max_steps;
    p.metric = metric_of(row, data, settings);
    try {
      dsl::plan::bind_arguments(workflow, p.arguments, dsl::plan::Knowledge::Complete);
      score_sample(p.metric, "", context_of(row));  // throws for gold the metric cannot use
    } catch (const InputError& e) {
      fail_row(e, row, data.path);
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string decodes_fingerprint(const exec::RunResult& result) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const exec::MessageRecord& m : result.messages) {
    if (m.kind != "decode") continue;
    XXH3_64bits_update(state, m.name.data(), m.name.size() + 1);  // with its terminating NUL
    const uint64_t n = m.tokens.size();
    XXH3_64bits_update(state, &n, sizeof n);
    XXH3_64bits_update(state, m.tokens.data(), m.tokens.size() * sizeof(m.tokens[0]));
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", digest);
}

namespace {

/// Scores `out.prediction` against the row's gold answers with its metric, filling the fields that follow
/// from them.
void score_prediction(const PreparedRow& prepared, ResultRow& out) {
  const Row& row = *prepared.row;
  const SampleScore scored =
      score_sample(prepared.metric, scored_text(prepared.metric, out.prediction), context_of(row));
  out.extracted = scored.extracted;
  out.score = scored.score;
  out.gold = row.gold;
  out.metric = std::string(metric_name(prepared.metric));
}

}  // namespace

ResultRow make_result(const PreparedRow& prepared, runtime::Mode mode, const exec::RunResult& result) {
  const Row& row = *prepared.row;
  ResultRow out;
  out.id = row.id;
  out.mode = std::string(runtime::mode_name(mode));
  out.prediction = result.output;
  score_prediction(prepared, out);
  out.subject = row.subject;
  out.level = row.level;
  const exec::RunTiming timing = exec::timing_of(result);
  out.ttft_ms = timing.ttft_ms;
  out.e2e_ms = timing.e2e_ms;
  out.tokens_generated = timing.n_generated;
  out.tokens_computed = timing.n_computed;
  out.tokens_reused = timing.n_reused;
  out.extra["line"] = row.line;
  out.extra["decodes_xxh3"] = decodes_fingerprint(result);
  return out;
}

std::string models_fingerprint(const model::Model& model, const EvalSettings& settings) {
  // Without the workflow's models, the run's model alone: the set of one that run_eval's engine makes of it.
  const runtime::ModelSet own(model, settings.lora ? *settings.lora : model::LoraStack{});
  const runtime::ModelSet& set = settings.models ? *settings.models : own;
  std::vector<uint64_t> parts;
  for (size_t i = 0; i < set.size(); ++i) {
    parts.push_back(set[i].fingerprint);
    parts.push_back(XXH3_64bits(set[i].name.data(), set[i].name.size()));
  }
  parts.push_back(uint64_t(settings.k_type));
  parts.push_back(uint64_t(settings.v_type));
  // A repair policy changes choreo mode's results: a file is resumed only under the same one (none, or no
  // --repair, keeps the fingerprint of a run before repair existed).
  if (settings.repair && !settings.repair->none()) parts.push_back(settings.repair->tag());
  return fmt::format("{:016x}", XXH3_64bits(parts.data(), parts.size() * sizeof(uint64_t)));
}

void check_resumed_models(const std::vector<ResultRow>& existing, const std::string& fingerprint,
                          const std::string& path) {
  for (const ResultRow& r : existing) {
    const auto it = r.extra.find("models_xxh3");
    if (it == r.extra.end() || !it->is_string() || it->get<std::string>() == fingerprint) continue;
    throw InputError(
        fmt::format("results file '{}' was made with other models: row '{}' ({}) has models_xxh3 {}, this run's "
                    "models and KV cache types give {}",
                    path, r.id, r.mode, it->get<std::string>(), fingerprint),
        "resume with the same -m, --lora/--lora-scaled, workflow `models:`, --cache-type-k/-v and --repair, or "
        "write to another --out");
  }
}

void require_fingerprints(const ResultsFile& existing, const std::string& path) {
  for (size_t i = 0; i < existing.rows.size(); ++i) {
    const ResultRow& r = existing.rows[i];
    const auto it = r.extra.find("models_xxh3");
    if (it != r.extra.end() && it->is_string()) continue;
    throw InputError(
        fmt::format("row '{}' ({}) has no extra.models_xxh3: nothing says which models and KV "
                    "cache types made it, so resuming could score two setups as one",
                    r.id, r.mode),
        "a file of an older choreo: resume it with --accept-old-results if it was made with this "
        "run's models, or write to another --out",
        SourceLocation{path, i < existing.lines.size() ? existing.lines[i] : 0, 0});
  }
}

size_t count_pending(const std::vector<PreparedRow>& rows, const std::vector<runtime::Mode>& modes,
                     const std::set<std::pair<std::string, std::string>>& done) {
  size_t n = 0;
  for (runtime::Mode mode : modes)
    for (const PreparedRow& p : rows)
      if (!done.count({p.row->id, std::string(runtime::mode_name(mode))})) ++n;
  return n;
}

EvalReport run_eval(const dsl::Workflow& workflow, const model::Model& model,
                    const std::vector<PreparedRow>& rows, const EvalSettings& settings,
                    const std::set<std::pair<std::string, std::string>>& done, ResultWriter& writer,
                    const EvalCallbacks& callbacks) {
  EvalReport report;
  // Without the workflow's models, the run's model alone.
  const runtime::ModelSet own(model, settings.lora ? *settings.lora : model::LoraStack{});
  const runtime::ModelSet& models = settings.models ? *settings.models : own;
  // Page faults on the weights and thread start, so the first mode's first rows do not pay for them.
  if (count_pending(rows, settings.modes, done) > 0) runtime::warm_up(models, settings.page_tokens);
  const std::string fingerprint = models_fingerprint(model, settings);
  for (runtime::Mode mode : settings.modes) {
    const std::string mode_text(runtime::mode_name(mode));
    std::vector<const PreparedRow*> pending;
    for (const PreparedRow& p : rows)
      if (!done.count({p.row->id, mode_text})) pending.push_back(&p);
    report.n_skipped += rows.size() - pending.size();
    if (pending.empty()) continue;
    if (callbacks.on_mode_start) callbacks.on_mode_start(mode, pending.size());

    // One engine per mode for the whole dataset: what every row shares (the static messages) is encoded once
    // per run, and when the pool is full the KV tiers evict what no running row uses (docs/store.md,
    // "Tiers"). Rows run in groups whose calls are batched across rows. No mode sees another's cache.
    runtime::EngineOptions options;
    options.mode = mode;
    options.page_tokens = settings.page_tokens;
    options.k_type = settings.k_type;
    options.v_type = settings.v_type;
    options.t0_bytes = settings.cache_bytes;
    options.tiers = settings.tiers;
    options.stores = settings.stores;  // choreo mode only
    if (mode == runtime::Mode::Choreo) options.repair = settings.repair;
    const std::unique_ptr<runtime::OpenedEngine> opened = runtime::open_engine(models, options);
    runtime::Engine& engine = opened->engine();
    std::optional<exec::LeakGuard> guard;
    if (settings.no_leak) guard.emplace(engine);
    const size_t group = size_t(std::max(1, settings.concurrency)) * 2;
    for (size_t first = 0; first < pending.size(); first += group) {
      const size_t n = std::min(group, pending.size() - first);
      exec::BatchScheduler scheduler(engine, guard ? &*guard : nullptr);
      std::mutex finished;  // serialises writes and callbacks
      const std::vector<std::exception_ptr> errors =
          scheduler.run(n, std::max(1, settings.concurrency), [&](size_t k, exec::CallSink& sink) {
            const PreparedRow& p = *pending[first + k];
            std::optional<ResultRow> result;
            std::exception_ptr error;
            try {
              result = make_result(p, mode, exec::run_workflow(workflow, sink, p.arguments));
              result->extra["models_xxh3"] = fingerprint;
              if (options.repair && !options.repair->none()) result->extra["repair"] = options.repair->name();
            } catch (const std::bad_alloc&) {
              throw;  // not the row's failure: the scheduler reports it, and the run stops with exit 1
            } catch (...) {
              error = std::current_exception();
            }
            std::lock_guard lock(finished);
            if (result) {
              writer.append(*result);  // an I/O failure here stops the run (rethrown below)
              if (callbacks.on_result) callbacks.on_result(*result);
              return;
            }
            EvalFailure failure{p.row->id, mode_text, p.row->line, describe_error(error)};
            if (callbacks.on_failure) callbacks.on_failure(failure);
            report.failures.push_back(std::move(failure));
          });
      for (const std::exception_ptr& error : errors)
        if (error) std::rethrow_exception(error);
    }
    report.n_run += pending.size();
  }
  return report;
}

std::vector<ResultRow> results_of_selection(const std::vector<ResultRow>& results,
                                            const std::vector<PreparedRow>& rows,
                                            const std::vector<runtime::Mode>& modes, size_t* n_rescored) {
  std::map<std::string, const PreparedRow*> by_id;
  for (const PreparedRow& p : rows) by_id.emplace(p.row->id, &p);
  std::set<std::string> mode_names;
  for (runtime::Mode mode : modes) mode_names.insert(std::string(runtime::mode_name(mode)));
  std::vector<ResultRow> out;
  if (n_rescored) *n_rescored = 0;
  for (const ResultRow& r : results) {
    const auto it = by_id.find(r.id);
    if (it == by_id.end() || !mode_names.count(r.mode)) continue;
    ResultRow scored = r;
    score_prediction(*it->second, scored);
    if (n_rescored && scored.score != r.score) ++*n_rescored;
    out.push_back(std::move(scored));
  }
  return out;
}

}  // namespace choreo::eval
