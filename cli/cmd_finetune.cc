// `choreo finetune` (docs/finetune.md): `traces` samples baseline traces of a workflow over rows of inputs;
// `train` fits a LoRA adapter so that the choreographed workflow, teacher-forced to those traces, gives them
// the highest likelihood, and writes it as a llama.cpp GGUF adapter.

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "runtime/engine/open_engine.h"
#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "runtime/eval/results.h"
#include "runtime/eval/selection.h"
#include "runtime/model/synth_lora.h"
#include "runtime/train/adapter_file.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/finetune.h"
#include "runtime/train/trainer.h"

namespace choreo::cli {

namespace {

struct TracesOptions {
  std::string workflow_path, inputs_path, out_path, shard = "0/1";
  std::vector<std::string> inputs, params;
  long limit = -1;
  float temperature = 1.0f;
  uint64_t seed = 0;
  EngineFlags engine;
};

struct TrainOptions {
  std::string workflow_path, traces_path, val_traces_path, out_path, targets = "q,k,v,o,gate,up,down";
  std::string layers;  // FIRST-LAST: the adapted layers (empty: all)
  bool val_given = false;  // --val on the command line
  int rank = 8;
  float alpha = 16.0f;
  int epochs = 2;
  double lr = 1e-4;
  double val = 0.1;
  int accumulate = 1;
  uint64_t seed = 0;
  EngineFlags engine;
  bool resume = false;
  std::string recompute = "auto";
  size_t activation_mib = 2048;
};

/// XXH3 of a file's bytes, read in pieces (a checkpoint names the traces it was trained on).
uint64_t file_xxh3(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read {}", path));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(size_t(1) << 20);
  while (in.read(buffer.data(), std::streamsize(buffer.size())) || in.gcount() > 0)
    XXH3_64bits_update(state, buffer.data(), size_t(in.gcount()));
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

/// A workflow that finetune can run: one model (the run's).
dsl::Workflow load_single_model_workflow(const std::string& path) {
  dsl::Workflow w = dsl::load_workflow(path);
  if (!w.models.empty())
    throw InputError(fmt::format("{}: choreo finetune trains workflows on one model; this one declares models:", path),
                     "remove `models:` and `model:` (the adapter trained is the model every call runs with)");
  return w;
}

/// An engine over the base model alone with a T0 of 2 GiB (within the device): a traces row, or the
/// structure of one trace's run.
std::unique_ptr<runtime::OpenedEngine> open_scratch_engine(std::shared_ptr<const runtime::LoadedModels> loaded,
                                                           runtime::Mode mode) {
  runtime::EngineOptions options;
  options.mode = mode;
  options.t0_bytes = kv::budget_within_device(*loaded->backend, size_t(2048) << 20);
  return runtime::open_engine(std::move(loaded), options);
}

void run_traces(const TracesOptions& o) {
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    throw InputError(fmt::format("--temperature {} is not a finite number of at least 0", o.temperature));
  const dsl::Workflow workflow = load_single_model_workflow(o.workflow_path);
  const exec::RunArguments base{key_values(o.inputs, "--input"), key_values(o.params, "--param")};
  const eval::Shard shard = eval::parse_shard(o.shard);
  std::vector<exec::InputRow> rows = exec::read_input_rows(o.inputs_path, workflow, base);
  if (o.limit >= 0 && size_t(o.limit) < rows.size()) rows.resize(size_t(o.limit));
  std::vector<exec::InputRow> mine;
  for (size_t i = 0; i < rows.size(); ++i)
    if (eval::in_shard(i, shard)) mine.push_back(rows[i]);
  // Resuming: rows already in the output are skipped (a torn last line is cut off and sampled again).
  std::set<int> done;
  for (const nlohmann::json& v : eval::read_json_lines(o.out_path, train::kTraceLines).values)
    if (v.is_object() && v.contains("line") && v["line"].is_number_integer()) done.insert(v["line"].get<int>());
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.engine.model_options());
  eval::LineAppender out(o.out_path, "-o", train::kTraceLines);
  size_t written = 0, skipped = 0, failed = 0;
  const double start = steady_ms();
  for (const exec::InputRow& row : mine) {
    if (done.contains(row.line)) {
      ++skipped;
      continue;
    }
    // The paper's baseline: every call a plain prefix-cached chat call.
    const std::unique_ptr<runtime::OpenedEngine> opened = open_scratch_engine(loaded, runtime::Mode::Prefix);
    std::optional<train::Trace> trace;
    try {
      trace = train::sample_trace(workflow, opened->engine(), row, o.temperature, o.seed);
    } catch (const InputError& e) {
      // As eval does: the row's error, then the other rows; nothing is written for it, so a rerun retries it.
      ++failed;
      std::fprintf(stderr, "traces: %s:%d: this row failed:\n%s\n", o.inputs_path.c_str(), row.line, e.render().c_str());
      continue;
    }
    out.append(train::trace_json(*trace).dump() + "\n");
    ++written;
    std::fprintf(stderr, "traces: %zu/%zu rows (line %d: %zu calls), %.1f s\n", written + skipped + failed,
                 mine.size(), row.line, trace->calls.size(), (steady_ms() - start) / 1000.0);
  }
  std::printf("traces: %zu rows sampled, %zu already in %s\n", written, skipped, o.out_path.c_str());
  if (failed > 0)
    throw InputError(fmt::format("{} of {} rows failed (their errors are above); their traces were not written", failed,
                                 mine.size()),
                     "fix the rows or the workflow and run the same command again: only the missing rows run");
}

void run_train(const TrainOptions& o) {
  // Everything that can be wrong with the input is found before the first training step.
  if (o.rank < 1) throw InputError(fmt::format("--rank {} is not positive", o.rank), "give --rank 1 or more");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw InputError(fmt::format("--lr {} is not a positive number", o.lr));
  if (!(o.val >= 0 && o.val < 1)) throw InputError(fmt::format("--val {} is not in [0, 1)", o.val));
  if (!o.val_traces_path.empty() && o.val_given)
    throw InputError("--val and --val-traces both choose the validation traces",
                     "give --val-traces FILE for held-out rows, or --val FRACTION to hold out part of --traces");
  const std::vector<model::LoraTarget> targets = model::parse_lora_targets(o.targets);
  const dsl::Workflow workflow = load_single_model_workflow(o.workflow_path);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.engine.model_options());
  const model::Model& base = loaded->model();
  const auto [first_layer, end_layer] =
      o.layers.empty() ? std::pair<int, int>{0, base.config().n_layers} : parse_layer_range(o.layers, "--layers", base.config().n_layers);
  const std::vector<train::Trace> traces = train::read_traces(o.traces_path, base.config().n_vocab);
  const std::vector<train::Trace> val_traces =
      o.val_traces_path.empty() ? std::vector<train::Trace>{} : train::read_traces(o.val_traces_path, base.config().n_vocab);
  const int max_rank = std::min(base.config().dim, base.config().n_kv_heads * base.config().head_dim);
  if (o.rank > max_rank)
    throw InputError(fmt::format("--rank {} is larger than the model's narrowest adapted weight ({})", o.rank, max_rank));
  check_writable(o.out_path, "-o");
  const std::string ckpt = train::checkpoint_path(o.out_path);
  if (o.resume && !std::filesystem::exists(ckpt))
    throw InputError(fmt::format("--resume: no checkpoint {} to resume", ckpt),
                     "a run writes it beside its -o after every epoch; start without --resume");
  uint64_t traces_hash = file_xxh3(o.traces_path);
  if (!o.val_traces_path.empty()) {
    const uint64_t both[2] = {traces_hash, file_xxh3(o.val_traces_path)};
    traces_hash = XXH3_64bits(both, sizeof both);
  }
  const train::CheckpointKey key{o.rank, o.alpha, o.targets, o.seed, traces_hash, base.fingerprint(), o.layers};

  // The choreographed run of every trace, teacher-forced: its messages (structure only; the numbers are
  // computed by the training graph).
  const auto structure = [&](const train::Trace& t, runtime::Mode mode) {
    return train::trace_messages(workflow, open_scratch_engine(loaded, mode)->engine(), t);
  };
  std::vector<train::Example> examples;
  for (const train::Trace& t : traces) examples.push_back(structure(t, runtime::Mode::Choreo));
  // Validation: --val-traces (held-out rows), or a seeded fraction of --traces.
  std::vector<const train::Trace*> val_sources;
  std::vector<train::Example> val_set, train_set;
  if (!val_traces.empty()) {
    train_set = std::move(examples);
    for (const train::Trace& t : val_traces) {
      val_set.push_back(structure(t, runtime::Mode::Choreo));
      val_sources.push_back(&t);
    }
  } else {
    std::vector<size_t> order(examples.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed));
    const size_t n_val = o.val > 0 ? std::max<size_t>(1, size_t(std::llround(o.val * double(examples.size())))) : 0;
    if (n_val >= examples.size())
      throw InputError(fmt::format("--val {} leaves no training example of the {} traces", o.val, examples.size()),
                       "give more traces or a smaller --val");
    for (size_t i = 0; i < order.size(); ++i) {
      if (i < n_val) val_sources.push_back(&traces[order[i]]);
      (i < n_val ? val_set : train_set).push_back(examples[order[i]]);
    }
  }
  // The same held-out traces under the baseline's structure (prefix mode, the base model): the log-loss the
  // choreographed run is trained to reach.
  std::vector<train::Example> val_baseline;
  for (const train::Trace* t : val_sources) {
    train::Example e = structure(*t, runtime::Mode::Prefix);
    for (train::GraphMessage& m : e) m.lora = false;
    val_baseline.push_back(std::move(e));
  }

  const train::FrozenModel frozen = train::FrozenModel::dequantise(base);
  train::LoraParams<float> lora = train::LoraParams<float>::init(frozen, targets, o.rank, o.alpha, o.seed, first_layer, end_layer);
  train::TrainState state;
  if (o.resume) {
    train::read_checkpoint(ckpt, key, lora, state);
    std::fprintf(stderr, "finetune: resuming %s after epoch %d (%zu steps)\n", ckpt.c_str(), state.epochs_done,
                 size_t(state.adam.steps()));
  }
  train::TrainSettings settings;
  settings.epochs = o.epochs;
  settings.accumulate = o.accumulate;
  settings.adam.lr = o.lr;
  settings.seed = o.seed;
  settings.recompute = o.recompute == "on"    ? train::TrainSettings::Recompute::On
                       : o.recompute == "off" ? train::TrainSettings::Recompute::Off
                                              : train::TrainSettings::Recompute::Auto;
  settings.activation_budget = o.activation_mib << 20;
  const double baseline_val = train::mean_loss(frozen, lora, val_baseline);
  double t = steady_ms();
  const double before_val = train::mean_loss(frozen, lora, val_set);  // (after the resumed epochs)
  const double forward_s = (steady_ms() - t) / 1000.0;
  size_t val_tokens = 0, train_tokens = 0;
  for (const train::Example& e : val_set)
    for (const train::GraphMessage& m : e) val_tokens += m.tokens.size();
  for (const train::Example& e : train_set)
    for (const train::GraphMessage& m : e) train_tokens += m.tokens.size();
  std::fprintf(stderr,
               "finetune: %zu training and %zu validation traces, %zu LoRA values; validation loss %.4f/token "
               "(the baseline's: %.4f)\n",
               train_set.size(), val_set.size(), lora.size(), before_val, baseline_val);
  const double start = steady_ms();
  const int epochs_before = state.epochs_done;
  double last_print = 0;
  const bool tty = ::isatty(STDERR_FILENO);
  train::train(
      frozen, lora, train_set, val_set, settings, state,
      [&](int epoch, size_t k, double loss) {
        const double now = steady_ms();
        if (!tty && now - last_print < 5000 && k + 1 < train_set.size()) return;
        last_print = now;
        std::fprintf(stderr, "%sfinetune: epoch %d/%d, %zu/%zu, loss %.4f/token, %.0f s%s", tty ? "\r\033[K" : "",
                     epoch, o.epochs, k + 1, train_set.size(), loss, (now - start) / 1000.0, tty ? "" : "\n");
      },
      [&](const train::EpochReport& r) {
        train::write_adapter(base, lora, o.out_path);  // usable now; the checkpoint then allows --resume
        train::write_checkpoint(ckpt, key, lora, state);
        std::fprintf(stderr, "%sfinetune: epoch %d: training loss %.4f/token, validation loss %.4f/token, "
                     "%zu steps%s; wrote %s\n",
                     tty ? "\r\033[K" : "", r.epoch, r.train_loss, r.val_loss, r.steps,
                     r.recomputed ? fmt::format(", {} traces with activation recomputation", r.recomputed).c_str() : "",
                     o.out_path.c_str());
      });
  if (state.epochs_done >= o.epochs && !std::filesystem::exists(o.out_path)) train::write_adapter(base, lora, o.out_path);
  const double train_s = (steady_ms() - start) / 1000.0;
  const double after_val = train::mean_loss(frozen, lora, val_set);
  std::printf("finetune: wrote %s (rank %d, alpha %g, %s%s); validation loss %.4f/token before, %.4f after\n",
              o.out_path.c_str(), o.rank, o.alpha, o.targets.c_str(),
              o.layers.empty() ? "" : fmt::format(", layers {}", o.layers).c_str(), before_val, after_val);
  if (!val_set.empty())
    std::printf("finetune: held-out log-loss gap to the baseline (prefix mode, %.4f/token): %+.4f before, %+.4f after\n",
                baseline_val, before_val - baseline_val, after_val - baseline_val);
  const int epochs_run = state.epochs_done - epochs_before;
  if (epochs_run > 0 && train_s > 0 && forward_s > 0)
    std::printf("finetune: training %.0f tokens/s (forward, backward and the step, with each epoch's validation pass; %zu "
                "tokens per epoch), forward "
                "only %.0f tokens/s\n",
                double(train_tokens) * epochs_run / train_s, train_tokens, double(val_tokens) / forward_s);
}

void add_traces(CLI::App& group) {
  auto o = std::make_shared<TracesOptions>();
  CLI::App* cmd = group.add_subcommand("traces", "sample baseline (prefix-mode) traces of a workflow over rows of inputs");
  cmd->add_option("workflow", o->workflow_path, "workflow file")->required();
  cmd->add_option("--inputs", o->inputs_path, "rows of inputs, one JSON object per line")->required();
  cmd->add_option("-o,--out", o->out_path, "traces file (JSON Lines; rows already in it are skipped)")->required();
  cmd->add_option("--limit", o->limit, "the first N rows only");
  cmd->add_option("--shard", o->shard, "I/N: rows whose index is I modulo N");
  cmd->add_option("--temperature", o->temperature, "sampling temperature of every decode (default 1)");
  cmd->add_option("--seed", o->seed, "seed of the sampling (with the row and the call name)");
  add_pairs_option(*cmd, "--input", o->inputs, "KEY=VALUE: an input every row shares (a row's own wins)");
  add_pairs_option(*cmd, "--param", o->params, "KEY=VALUE: a parameter of the workflow");
  o->engine.add(*cmd, EngineFlags::kModel);
  cmd->callback([o] { run_traces(*o); });
}

void add_train(CLI::App& group) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* cmd = group.add_subcommand(
      "train", "train a LoRA adapter so that the choreographed workflow reproduces baseline traces");
  cmd->add_option("workflow", o->workflow_path, "workflow file")->required();
  cmd->add_option("--traces", o->traces_path, "traces file from `choreo finetune traces`")->required();
  cmd->add_option("-o,--out", o->out_path, "the adapter (GGUF), written after every epoch")->required();
  cmd->add_option("--rank", o->rank, "LoRA rank (default 8)");
  cmd->add_option("--alpha", o->alpha, "LoRA alpha: the product is scaled by alpha / rank (default 16)");
  cmd->add_option("--targets", o->targets, "adapted projections, a subset of q,k,v,o,gate,up,down (default all)");
  cmd->add_option("--layers", o->layers,
                  "adapted layers, FIRST-LAST (both included) or one layer (default all), as PEFT's layers_to_transform");
  cmd->add_option("--epochs", o->epochs, "passes over the training traces (default 2)")->check(CLI::Range(0, 1000000));
  cmd->add_option("--lr", o->lr, "AdamW learning rate (default 1e-4)");
  cmd->add_option("--val", o->val, "fraction of the traces held out for the validation loss (default 0.1)")
      ->each([o](const std::string&) { o->val_given = true; });
  cmd->add_option("--val-traces", o->val_traces_path,
                  "validation traces from another file (rows held out of --traces) instead of --val");
  cmd->add_option("--accumulate", o->accumulate, "traces per optimiser step (default 1)")->check(at_least(1));
  cmd->add_option("--seed", o->seed, "seed of the initial A matrices, the split and the order");
  cmd->add_option("--recompute", o->recompute,
                  "activation recomputation: keep only each layer's input and compute the rest again in the backward "
                  "pass (auto: for traces whose activations exceed --activation-mib; default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--activation-mib", o->activation_mib,
                  "activation memory of one trace above which --recompute auto recomputes (default 2048)")
      ->check(CLI::Range(size_t(1), size_t(1) << 30));
  cmd->add_flag("--resume", o->resume,
                "continue from the checkpoint written beside -o after the last finished epoch (ADAPTER.gguf.ckpt)");
  o->engine.add(*cmd, EngineFlags::kModel);
  cmd->callback([o] { run_train(*o); });
}

}  // namespace

void register_finetune(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "finetune", "LoRA distillation of a choreographed workflow from baseline traces (traces, train)");
  cmd->require_subcommand(1);
  add_traces(*cmd);
  add_train(*cmd);
}

}  // namespace choreo::cli
