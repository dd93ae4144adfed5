#pragma once
// The run form of `choreo eval` (docs/eval.md, "Running a workflow over a dataset"): every selected row in
// every mode, one engine (and page pool) per mode, modes one after the other, rows within a mode run as
// workflow instances whose engine calls share batches (exec::BatchScheduler). Each (row, mode) becomes one
// ResultRow, appended to the results file the moment its instance finishes, so a kill loses nothing already
// written and `--resume` carries on from the file.

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/repair_policy.h"
#include "dsl/workflow.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/open_engine.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/metric.h"
#include "runtime/eval/results.h"
#include "runtime/eval/selection.h"
#include "runtime/exec/interpreter.h"
#include "runtime/model/llama.h"

namespace choreo::eval {

/// How a run is set up, beyond the workflow, the model and the rows.
struct EvalSettings {
  std::vector<runtime::Mode> modes = {runtime::Mode::Choreo};  // run in this order
  int concurrency = 4;                                         // instances in flight at once within a mode
  std::optional<Metric> metric;             // --metric; else the dataset's (per row for LongBench)
  InputMap input_map;                       // --map input=field
  exec::RunArguments shared;                // --param values every row gets
  bool no_leak = false;                     // re-encode parents carrying other agents' private messages
  int page_tokens = 32;                     // KV page size
  kernels::DType k_type = kernels::DType::F32;  // KV cache types (--cache-type-k / --cache-type-v)
  kernels::DType v_type = kernels::DType::F32;
  size_t cache_bytes = size_t(4096) << 20;  // page pool (T0) budget per mode
  const model::LoraStack* lora = nullptr;  // the adapters every call runs with (not owned); null: the base model
  // The workflow's models (exec::load_workflow_models; not owned), whose model 0 is the run's model with
  // `lora`: calls choose among them with `model:`. null: every call runs on the run's model.
  const runtime::ModelSet* models = nullptr;
  kv::TierSettings tiers;                    // T1/T2 budgets and eviction policy (runtime/kv/tiers.h)
  // The persistent store (T2) that choreo-mode engines read encodings from, e.g. PML modules saved by
  // `choreo encode` (written only by eviction, within tiers.disk_bytes), and a Redis T3. The baselines never
  // use them: they stand for serving without encodings kept across runs.
  runtime::StoreOptions stores;
  // choreo mode's repair policy for every call (over the workflow's `repair:`; docs/profile.md "Repairing
  // reused KV"); unset: the workflow's. The baselines re-encode every prompt: nothing to repair.
  std::optional<RepairPolicy> repair;
};

/// A selected row made ready to run: the workflow's arguments and the metric that scores it.
struct PreparedRow {
  const Row* row = nullptr;
  exec::RunArguments arguments;
  Metric metric = Metric::math;
};

/// Checks every row before any model time is spent and prepares it: the workflow has an `output:`, each
/// row has the fields its inputs need and they convert to the inputs' types, and each row's gold answers
/// are usable by its metric. Bad data is an InputError naming the data file and the row's line.
std::vector<PreparedRow> prepare_rows(const dsl::Workflow& workflow, const Dataset& data,
                                      const std::vector<Row>& rows, const EvalSettings& settings);

/// A fingerprint of every decode of a run: XXH3-64 (16 hex digits) over each decode's name and tokens (header
/// and generated), in the order the run recorded them. Equal fingerprints mean the same generations, so
/// results files from different shards, concurrencies or machines can be compared row by row.
std::string decodes_fingerprint(const exec::RunResult& result);

/// What a run's outputs depend on beyond its rows and modes: every model it runs (the weights file, each
/// adapter and its scale, and the workflow's model names when `settings.models` is set) and the KV cache
/// types, as XXH3-64 (16 hex digits). Every result row carries it as `extra.models_xxh3`.
std::string models_fingerprint(const model::Model& model, const EvalSettings& settings);

/// InputError when a row of `existing` (the results file at `path` that a --resume run appends to) was
/// made with other models or KV cache types than `fingerprint` (models_fingerprint) says: mixing them
/// would score two setups as one. Rows without `extra.models_xxh3` pass here: require_fingerprints refuses
/// them first unless old files are accepted.
void check_resumed_models(const std::vector<ResultRow>& existing, const std::string& fingerprint,
                          const std::string& path);

/// InputError at its line for the first row of `existing` (the results file at `path`) without
/// `extra.models_xxh3`: nothing says which models made it (a file of a version before the fingerprint, or one
/// written by hand), so resuming it could score two setups as one. `eval --accept-old-results` skips this.
void require_fingerprints(const ResultsFile& existing, const std::string& path);

/// The result line of one finished (row, mode): the workflow's output as prediction, its score, and the
/// run's TTFT (sum over decode steps), end-to-end time and token counts (exec::timing_of).
ResultRow make_result(const PreparedRow& prepared, runtime::Mode mode, const exec::RunResult& result);

/// A (row, mode) whose instance stopped with an error; nothing was written for it, so --resume retries it.
struct EvalFailure {
  std::string id, mode;
  int line = 0;         // the row's line in the data file
  std::string message;  // the error as the CLI renders it
};

/// What happened during a run.
struct EvalReport {
  size_t n_run = 0;      // (row, mode) instances started
  size_t n_skipped = 0;  // (row, mode) pairs already in the results file
  std::vector<EvalFailure> failures;
};

/// Events of a run, for progress displays. Calls are serialised (never two at once), but may come from
/// worker threads.
struct EvalCallbacks {
  std::function<void(runtime::Mode mode, size_t n_instances)> on_mode_start;
  std::function<void(const ResultRow& row)> on_result;  // after the row is written
  std::function<void(const EvalFailure& failure)> on_failure;
};

/// (row, mode) pairs the run will do: every prepared row in every mode, minus the pairs in `done`.
size_t count_pending(const std::vector<PreparedRow>& rows, const std::vector<runtime::Mode>& modes,
                     const std::set<std::pair<std::string, std::string>>& done);

/// Runs every pending (row, mode) of `rows` on `model`, appending each result to `writer` as it finishes.
/// A failing instance does not stop the others; it is reported in the returned failures.
EvalReport run_eval(const dsl::Workflow& workflow, const model::Model& model,
                    const std::vector<PreparedRow>& rows, const EvalSettings& settings,
                    const std::set<std::pair<std::string, std::string>>& done, ResultWriter& writer,
                    const EvalCallbacks& callbacks = {});

/// The rows of `results` that belong to this run's selection (its row ids in its modes), each scored again
/// from its prediction against the data's gold answers with the run's metric, as make_result scores: what the
/// closing summary is computed over, so a results file shared with other selections does not leak into it,
/// and a score written into the file (a resumed row's) is never taken on trust. `n_rescored`, when given,
/// counts the rows whose score in the file differed.
std::vector<ResultRow> results_of_selection(const std::vector<ResultRow>& results,
                                            const std::vector<PreparedRow>& rows,
                                            const std::vector<runtime::Mode>& modes,
                                            size_t* n_rescored = nullptr);

}  // namespace choreo::eval
