// `choreo finetune` (docs/finetune.md): `traces` samples baseline traces of a workflow over rows of inputs;
// `train` fits a LoRA adapter so that the choreographed workflow, teacher-forced to those traces, gives them
// the highest likelihood, and writes it as a llama.cpp GGUF adapter.

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/clock.h"
#include "common/error.h"
#include "runtime/eval/selection.h"
#include "runtime/train/finetune.h"
#include "runtime/train/train_adapter.h"

namespace choreo::cli {

namespace {

struct TracesOptions {
  train::SampleTracesOptions traces;
  std::string shard = "0/1";
  std::vector<std::string> inputs, params;
  EngineFlags engine;
};

struct TrainOptions {
  train::TrainAdapterOptions train;
  double val = 0.1;  // --val (train.val when given)
  std::string recompute = "auto";
  size_t activation_mib = 2048;
  EngineFlags engine;
};

void print_row(const train::SampleTracesOptions& o, const train::SampledRow& r) {
  if (r.error)
    std::fprintf(stderr, "traces: %s:%d: this row failed:\n%s\n", o.inputs_path.c_str(), r.line, r.error->render().c_str());
  else
    std::fprintf(stderr, "traces: %zu/%zu rows (line %d: %zu calls), %.1f s\n", r.done, r.n_rows, r.line,
                 r.trace->calls.size(), r.seconds);
}

void run_traces(TracesOptions& o) {
  train::SampleTracesOptions& t = o.traces;
  t.models = o.engine.model_options();
  t.shared = {key_values(o.inputs, "--input"), key_values(o.params, "--param")};
  t.shard = eval::parse_shard(o.shard);
  t.on_row = [&](const train::SampledRow& r) { print_row(t, r); };
  const train::SampleTracesReport r = train::sample_traces(t);
  std::printf("traces: %zu rows sampled, %zu already in %s\n", r.written, r.skipped, t.out_path.c_str());
  if (r.failed > 0)
    throw InputError(fmt::format("{} of {} rows failed (their errors are above); their traces were not written",
                                 r.failed, r.n_rows),
                     "fix the rows or the workflow and run the same command again: only the missing rows run");
}

/// Progress on stderr: on a terminal, one line rewritten; otherwise a line every 5 s and at each epoch's end.
class TrainProgress {
 public:
  explicit TrainProgress(const train::TrainAdapterOptions& o) : options_(o), tty_(::isatty(STDERR_FILENO)) {}

  void start(const train::TrainAdapterReport& r) {
    if (r.resumed)
      std::fprintf(stderr, "finetune: resuming %s after epoch %d (%zu steps)\n", r.checkpoint.c_str(), r.epochs_resumed,
                   size_t(r.steps_resumed));
    validated_ = r.n_val > 0;
    if (validated_)
      std::fprintf(
          stderr,
          "finetune: %zu training and %zu validation traces, %zu LoRA values; validation loss %.4f/token "
          "(the baseline's: %.4f)\n",
          r.n_train, r.n_val, r.n_values, r.before_val_loss, r.baseline_val_loss);
    else
      std::fprintf(stderr,
                   "finetune: %zu training traces and no validation traces (--val 0), %zu LoRA values\n",
                   r.n_train, r.n_values);
    start_ms_ = steady_ms();
  }
  void example(int epoch, size_t k, size_t n, double loss) {
    const double now = steady_ms();
    if (!tty_ && now - last_print_ms_ < 5000 && k + 1 < n) return;
    last_print_ms_ = now;
    std::fprintf(stderr, "%sfinetune: epoch %d/%d, %zu/%zu, loss %.4f/token, %.0f s%s", tty_ ? "\r\033[K" : "", epoch,
                 options_.epochs, k + 1, n, loss, (now - start_ms_) / 1000.0, tty_ ? "" : "\n");
  }
  void epoch(const train::EpochReport& r, bool written) {
    std::fprintf(
        stderr, "%sfinetune: epoch %d: training loss %.4f/token, %s, %zu steps%s%s\n", tty_ ? "\r\033[K" : "",
        r.epoch, r.train_loss,
        validated_ ? fmt::format("validation loss {:.4f}/token", r.val_loss).c_str() : "no validation",
        r.steps,
        r.recomputed ? fmt::format(", {} traces with activation recomputation", r.recomputed).c_str() : "",
        written ? fmt::format("; wrote {}", options_.out_path).c_str() : "");
  }

 private:
  const train::TrainAdapterOptions& options_;
  const bool tty_;
  bool validated_ = true;  // false with no validation traces (--val 0): there is no validation loss to print
  double start_ms_ = 0, last_print_ms_ = 0;
};

void print_trained(const train::TrainAdapterOptions& o, const train::TrainAdapterReport& r) {
  const std::string validation = r.n_val > 0
                                     ? fmt::format("validation loss {:.4f}/token before, {:.4f} after",
                                                   r.before_val_loss, r.after_val_loss)
                                     : std::string("no validation traces (--val 0)");
  std::printf("finetune: wrote %s (rank %d, alpha %g, %s%s); %s\n", o.out_path.c_str(), o.rank, o.alpha,
              o.targets.c_str(), o.layers.empty() ? "" : fmt::format(", layers {}", o.layers).c_str(),
              validation.c_str());
  if (r.n_val > 0)
    std::printf("finetune: held-out log-loss gap to the baseline (prefix mode, %.4f/token): %+.4f before, %+.4f after\n",
                r.baseline_val_loss, r.before_val_loss - r.baseline_val_loss, r.after_val_loss - r.baseline_val_loss);
  if (r.epochs_run > 0 && r.train_seconds > 0)
    std::printf(
        "finetune: training %.0f tokens/s (forward, backward and the step%s; %zu tokens per epoch)%s\n",
        double(r.train_tokens) * r.epochs_run / r.train_seconds,
        r.n_val > 0 ? ", with each epoch's validation pass" : "", r.train_tokens,
        r.n_val > 0 && r.forward_seconds > 0
            ? fmt::format(", forward only {:.0f} tokens/s", double(r.val_tokens) / r.forward_seconds).c_str()
            : "");
}

void run_train(TrainOptions& o) {
  train::TrainAdapterOptions& t = o.train;
  t.models = o.engine.model_options();
  t.recompute = o.recompute == "on"    ? train::TrainSettings::Recompute::On
                : o.recompute == "off" ? train::TrainSettings::Recompute::Off
                                       : train::TrainSettings::Recompute::Auto;
  t.activation_bytes = o.activation_mib << 20;
  TrainProgress progress(t);
  t.on_start = [&](const train::TrainAdapterReport& r) { progress.start(r); };
  t.on_example = [&](int epoch, size_t k, size_t n, double loss) { progress.example(epoch, k, n, loss); };
  t.on_epoch = [&](const train::EpochReport& r, bool written) { progress.epoch(r, written); };
  print_trained(t, train::train_adapter(t));
}

void add_traces(CLI::App& group) {
  auto o = std::make_shared<TracesOptions>();
  train::SampleTracesOptions& t = o->traces;
  CLI::App* cmd = group.add_subcommand("traces", "sample baseline (prefix-mode) traces of a workflow over rows of inputs");
  cmd->add_option("workflow", t.workflow_path, "workflow file")->required();
  cmd->add_option("--inputs", t.inputs_path, "rows of inputs, one JSON object per line")->required();
  cmd->add_option("-o,--out", t.out_path, "traces file (JSON Lines; rows already in it are skipped)")->required();
  cmd->add_option("--limit", t.limit, "the first N rows only");
  cmd->add_option("--shard", o->shard, "I/N: rows whose index is I modulo N");
  cmd->add_option("--temperature", t.temperature, "sampling temperature of every decode (default 1)");
  cmd->add_option("--seed", t.seed, "seed of the sampling (with the row and the call name)");
  add_pairs_option(*cmd, "--input", o->inputs, "KEY=VALUE: an input every row shares (a row's own wins)");
  add_pairs_option(*cmd, "--param", o->params, "KEY=VALUE: a parameter of the workflow");
  o->engine.add(*cmd, EngineFlags::kModel);
  cmd->callback([o] { run_traces(*o); });
}

void add_train(CLI::App& group) {
  auto o = std::make_shared<TrainOptions>();
  train::TrainAdapterOptions& t = o->train;
  CLI::App* cmd = group.add_subcommand(
      "train", "train a LoRA adapter so that the choreographed workflow reproduces baseline traces");
  cmd->add_option("workflow", t.workflow_path, "workflow file")->required();
  cmd->add_option("--traces", t.traces_path, "traces file from `choreo finetune traces`")->required();
  cmd->add_option("-o,--out", t.out_path, "the adapter (GGUF), written after every epoch (a device or FIFO: once, at the end)")
      ->required();
  cmd->add_option("--rank", t.rank, "LoRA rank (default 8)");
  cmd->add_option("--alpha", t.alpha, "LoRA alpha: the product is scaled by alpha / rank (default 16)");
  cmd->add_option("--targets", t.targets, "adapted projections, a subset of q,k,v,o,gate,up,down (default all)");
  cmd->add_option("--layers", t.layers,
                  "adapted layers, FIRST-LAST (both included) or one layer (default all), as PEFT's layers_to_transform");
  cmd->add_option("--epochs", t.epochs, "passes over the training traces (default 2)")->check(CLI::Range(0, 1000000));
  cmd->add_option("--lr", t.lr, "AdamW learning rate (default 1e-4)");
  cmd->add_option("--val", o->val, "fraction of the traces held out for the validation loss (default 0.1)");
  cmd->add_option("--val-traces", t.val_traces_path,
                  "validation traces from another file (rows held out of --traces) instead of --val");
  cmd->add_option("--accumulate", t.accumulate, "traces per optimiser step (default 1)")->check(at_least(1));
  cmd->add_option("--seed", t.seed, "seed of the initial A matrices, the split and the order");
  cmd->add_option("--recompute", o->recompute,
                  "activation recomputation: keep only each layer's input and compute the rest again in the backward "
                  "pass (auto: for traces whose activations exceed --activation-mib; default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--activation-mib", o->activation_mib,
                  "activation memory of one trace above which --recompute auto recomputes (default 2048)")
      ->check(CLI::Range(size_t(1), size_t(1) << 30));
  cmd->add_flag("--resume", t.resume,
                "continue from the checkpoint written beside -o after the last finished epoch (ADAPTER.gguf.ckpt)");
  o->engine.add(*cmd, EngineFlags::kModel);
  cmd->callback([o, cmd] {
    if (cmd->count("--val") > 0) o->train.val = o->val;
    run_train(*o);
  });
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
