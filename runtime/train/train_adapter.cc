#include "runtime/train/train_adapter.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/error.h"
#include "runtime/model/synth_lora.h"
#include "runtime/train/adapter_file.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/finetune.h"

namespace choreo::train {

namespace {

/// The settings' own checks (no file read): the adapted targets, parsed.
std::vector<model::LoraTarget> check_settings(const TrainAdapterOptions& o) {
  if (o.rank < 1) throw InputError(fmt::format("--rank {} is not positive", o.rank), "give --rank 1 or more");
  if (!(o.lr > 0) || !std::isfinite(o.lr))
    throw InputError(fmt::format("--lr {} is not a positive number", o.lr));
  const double val = o.val.value_or(0.1);
  if (!(val >= 0 && val < 1)) throw InputError(fmt::format("--val {} is not in [0, 1)", val));
  if (!o.val_traces_path.empty() && o.val)
    throw InputError(
        "--val and --val-traces both choose the validation traces",
        "give --val-traces FILE for held-out rows, or --val FRACTION to hold out part of --traces");
  if (o.epochs < 0) throw InputError(fmt::format("--epochs {} is negative", o.epochs));
  if (o.accumulate < 1) throw InputError(fmt::format("--accumulate {} is not positive", o.accumulate));
  if (!o.models.adapters.empty())
    throw InputError("finetune trains an adapter from the base model, and adapters were given over it",
                     "drop --lora: training starts from the base model");
  return model::parse_lora_targets(o.targets);
}

/// The adapter's path and the checkpoint's beside it, checked under docs/limits.md's rules before any work.
/// Returns the checkpoint's path; empty when the adapter is written in place (a device or FIFO), which keeps
/// no checkpoint.
std::string check_outputs(const TrainAdapterOptions& o) {
  if (check_writable(o.out_path, "-o")) {
    if (o.resume)
      throw InputError(
          fmt::format("--resume: -o {} is a device or FIFO, written in place, with no checkpoint "
                      "beside it",
                      o.out_path),
          "resume a run whose -o is a file");
    return {};
  }
  const std::string checkpoint = checkpoint_path(o.out_path);
  if (check_writable(checkpoint, "the checkpoint"))
    throw InputError(
        fmt::format("-o {}: the checkpoint beside it, {}, is a device or FIFO, which --resume could not "
                    "read back",
                    o.out_path, checkpoint),
        "remove it, or choose another -o");
  if (o.resume && !std::filesystem::exists(checkpoint))
    throw InputError(fmt::format("--resume: no checkpoint {} to resume", checkpoint),
                     "a run writes it beside its -o after every epoch; start without --resume");
  return checkpoint;
}

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

CheckpointKey checkpoint_key(const TrainAdapterOptions& o, const model::Model& base) {
  uint64_t traces_hash = file_xxh3(o.traces_path);
  if (!o.val_traces_path.empty()) {
    const uint64_t both[2] = {traces_hash, file_xxh3(o.val_traces_path)};
    traces_hash = XXH3_64bits(both, sizeof both);
  }
  const double val = o.val_traces_path.empty() ? o.val.value_or(0.1) : 0.0;
  return {o.rank, o.alpha,      o.targets, o.layers,    o.seed,
          o.lr,   o.accumulate, val,       traces_hash, base.fingerprint()};
}

/// The examples: the choreographed run of every trace, teacher-forced (its messages: structure only, the
/// numbers are computed by the training graph), split into training and validation; and the validation
/// traces under the baseline's structure (prefix mode, the base model), the log-loss training aims for.
struct Examples {
  std::vector<Example> train, val, val_baseline;
};

Examples make_examples(const TrainAdapterOptions& o, const dsl::Workflow& workflow,
                       const std::shared_ptr<const runtime::LoadedModels>& loaded,
                       const std::vector<Trace>& traces, const std::vector<Trace>& val_traces) {
  const auto structure = [&](const Trace& t, runtime::Mode mode) {
    return trace_messages(workflow, open_scratch_engine(loaded, mode)->engine(), t);
  };
  std::vector<Example> examples;
  for (const Trace& t : traces) examples.push_back(structure(t, runtime::Mode::Choreo));
  // Validation: --val-traces (held-out rows), or a seeded fraction of --traces.
  Examples out;
  std::vector<const Trace*> val_sources;
  if (!val_traces.empty()) {
    out.train = std::move(examples);
    for (const Trace& t : val_traces) {
      out.val.push_back(structure(t, runtime::Mode::Choreo));
      val_sources.push_back(&t);
    }
  } else {
    std::vector<size_t> order(examples.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed));
    const double val = o.val.value_or(0.1);
    const size_t n_val =
        val > 0 ? std::max<size_t>(1, size_t(std::llround(val * double(examples.size())))) : 0;
    if (n_val >= examples.size())
      throw InputError(
          fmt::format("--val {} leaves no training example of the {} traces", val, examples.size()),
          "give more traces or a smaller --val");
    for (size_t i = 0; i < order.size(); ++i) {
      if (i < n_val) val_sources.push_back(&traces[order[i]]);
      (i < n_val ? out.val : out.train).push_back(examples[order[i]]);
    }
  }
  for (const Trace* t : val_sources) {
    Example e = structure(*t, runtime::Mode::Prefix);
    for (GraphMessage& m : e) m.lora = false;
    out.val_baseline.push_back(std::move(e));
  }
  return out;
}

size_t tokens_of(const std::vector<Example>& examples) {
  size_t n = 0;
  for (const Example& e : examples)
    for (const GraphMessage& m : e) n += m.tokens.size();
  return n;
}

/// The sizes, and the validation losses before this run's epochs.
void measure_before(const FrozenModel& frozen, const LoraParams<float>& lora, const Examples& examples,
                    TrainAdapterReport& report) {
  report.n_train = examples.train.size();
  report.n_val = examples.val.size();
  report.n_values = lora.size();
  report.train_tokens = tokens_of(examples.train);
  report.val_tokens = tokens_of(examples.val);
  report.baseline_val_loss = mean_loss(frozen, lora, examples.val_baseline);
  const double t = steady_ms();
  report.before_val_loss = mean_loss(frozen, lora, examples.val);  // (after the resumed epochs)
  report.forward_seconds = (steady_ms() - t) / 1000.0;
}

/// What the epochs need besides the options.
struct Training {
  const model::Model& base;
  const FrozenModel& frozen;
  LoraParams<float>& lora;
  const Examples& examples;
  const CheckpointKey& key;
  TrainState& state;
};

/// The epochs after state.epochs_done, the adapter and the checkpoint written after each; an adapter
/// written in place is written once, at the end.
void run_epochs(const TrainAdapterOptions& o, Training& t, TrainAdapterReport& report) {
  TrainSettings settings;
  settings.epochs = o.epochs;
  settings.accumulate = o.accumulate;
  settings.adam.lr = o.lr;
  settings.seed = o.seed;
  settings.recompute = o.recompute;
  settings.activation_budget = o.activation_bytes;
  const bool in_place = report.checkpoint.empty();
  const double start = steady_ms();
  const int epochs_before = t.state.epochs_done;
  train(
      t.frozen, t.lora, t.examples.train, t.examples.val, settings, t.state,
      [&](int epoch, size_t k, double loss) {
        if (o.on_example) o.on_example(epoch, k, t.examples.train.size(), loss);
      },
      [&](const EpochReport& r) {
        if (!in_place) {
          write_adapter(t.base, t.lora, o.out_path);  // usable now; the checkpoint then allows --resume
          write_checkpoint(report.checkpoint, t.key, t.lora, t.state);
        }
        if (o.on_epoch) o.on_epoch(r, !in_place);
      });
  if (in_place || (t.state.epochs_done >= o.epochs && !std::filesystem::exists(o.out_path)))
    write_adapter(t.base, t.lora, o.out_path);
  report.train_seconds = (steady_ms() - start) / 1000.0;
  report.epochs_run = t.state.epochs_done - epochs_before;
}

}  // namespace

TrainAdapterReport train_adapter(const TrainAdapterOptions& o) {
  // Everything that can be wrong with the input is found before the first training step.
  const std::vector<model::LoraTarget> targets = check_settings(o);
  TrainAdapterReport report;
  report.checkpoint = check_outputs(o);
  const dsl::Workflow workflow = load_single_model_workflow(o.workflow_path);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.models);
  const model::Model& base = loaded->model();
  const model::LlamaConfig& config = base.config();
  const auto [first_layer, end_layer] = o.layers.empty()
                                            ? std::pair<int, int>{0, config.n_layers}
                                            : model::parse_layer_range(o.layers, "--layers", config.n_layers);
  const std::vector<Trace> traces = read_traces(o.traces_path, config.n_vocab);
  const std::vector<Trace> val_traces =
      o.val_traces_path.empty() ? std::vector<Trace>{} : read_traces(o.val_traces_path, config.n_vocab);
  const int max_rank = std::min(config.dim, config.n_kv_heads * config.head_dim);
  if (o.rank > max_rank)
    throw InputError(
        fmt::format("--rank {} is larger than the model's narrowest adapted weight ({})", o.rank, max_rank));
  const CheckpointKey key = checkpoint_key(o, base);
  const Examples examples = make_examples(o, workflow, loaded, traces, val_traces);

  const FrozenModel frozen = FrozenModel::dequantise(base);
  LoraParams<float> lora =
      LoraParams<float>::init(frozen, targets, o.rank, o.alpha, o.seed, first_layer, end_layer);
  TrainState state;
  if (o.resume) {
    read_checkpoint(report.checkpoint, key, lora, state);
    report.resumed = true;
    report.epochs_resumed = state.epochs_done;
    report.steps_resumed = state.adam.steps();
  }
  measure_before(frozen, lora, examples, report);
  if (o.on_start) o.on_start(report);
  Training training{base, frozen, lora, examples, key, state};
  run_epochs(o, training, report);
  report.after_val_loss = mean_loss(frozen, lora, examples.val);
  return report;
}

}  // namespace choreo::train
