#pragma once
// `choreo finetune train` (docs/finetune.md): fits a LoRA adapter so that a workflow's choreographed run,
// teacher-forced to baseline traces, gives them the highest likelihood. Checks every input and output before
// any work; splits the traces into training and validation examples; trains from scratch or from the
// checkpoint beside the adapter; writes the adapter (and the checkpoint) after every epoch.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/engine/open_engine.h"
#include "runtime/train/trainer.h"

namespace choreo::train {

/// What train_adapter reports: before training (to on_start), and when it is done.
struct TrainAdapterReport {
  size_t n_train = 0, n_val = 0;  // traces
  size_t n_values = 0;            // LoRA values trained
  size_t train_tokens = 0;        // of the training examples' messages: the tokens one epoch runs
  size_t val_tokens = 0;          // of the validation examples' messages
  /// The checkpoint written beside the adapter after every epoch; empty when the adapter is written in place
  /// (a device or FIFO: it is written once, at the end, and no checkpoint is kept).
  std::string checkpoint;
  bool resumed = false;  // from the checkpoint: these epochs and optimiser steps were done before
  int epochs_resumed = 0;
  uint64_t steps_resumed = 0;
  /// Mean log-loss per target token of the validation traces: the baseline's (prefix mode, the base model),
  /// and the choreographed run's under the adapter before and after this run's epochs (NaN without any).
  double baseline_val_loss = 0, before_val_loss = 0, after_val_loss = 0;
  int epochs_run = 0;
  double train_seconds = 0;    // the epochs (forward, backward, the step, each epoch's validation pass)
  double forward_seconds = 0;  // one forward pass over the validation examples
};

/// What train_adapter trains, on what, and where it writes.
struct TrainAdapterOptions {
  /// The base model, without adapters: training starts from it.
  runtime::ModelOptions models;
  std::string workflow_path;    // one model: a workflow declaring `models:` is an InputError
  std::string traces_path;      // from `choreo finetune traces`
  std::string val_traces_path;  // validation traces of their own; empty: a fraction of traces_path
  std::optional<double> val;    // that fraction, in [0, 1) (nullopt: 0.1, or none with val_traces_path)
  std::string out_path;         // the adapter (GGUF); the checkpoint is checkpoint_path(out_path)
  std::string targets = "q,k,v,o,gate,up,down";
  std::string layers;  // FIRST-LAST: the adapted layers (empty: all)
  int rank = 8;
  float alpha = 16.0f;
  int epochs = 2;  // the run's total, resumed epochs included
  double lr = 1e-4;
  int accumulate = 1;   // traces per optimiser step
  uint64_t seed = 0;    // of the initial A matrices, the split and the order
  bool resume = false;  // from the checkpoint, which must exist and match the settings, traces and model
  TrainSettings::Recompute recompute = TrainSettings::Recompute::Auto;
  size_t activation_bytes = size_t(2) << 30;  // of one trace, above which Recompute::Auto recomputes
  std::function<void(const TrainAdapterReport&)> on_start;  // before the first epoch: sizes, losses before
  std::function<void(int epoch, size_t index, size_t n_examples, double loss)> on_example;
  /// After each epoch, once the adapter and the checkpoint are written (`written`: false when the adapter is
  /// written in place, at the end).
  std::function<void(const EpochReport&, bool written)> on_epoch;
};

/// Trains and writes the adapter. InputError, before any work and with nothing written, for bad settings,
/// workflow, traces or model, an -o or checkpoint path that cannot be written, and a checkpoint that cannot
/// be resumed.
TrainAdapterReport train_adapter(const TrainAdapterOptions& options);

}  // namespace choreo::train
