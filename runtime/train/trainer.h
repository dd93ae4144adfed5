#pragma once
// The training loop of `choreo finetune train` (issue 13): AdamW over the LoRA pairs only (the base weights
// stay frozen), the loss of each example being the summed log-loss of its decodes' generated tokens
// (runtime/train/graph.h), with gradient accumulation, and a validation loss per epoch.

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/train/graph.h"

namespace choreo::train {

/// AdamW (decoupled weight decay) over a flat list of parameters.
class AdamW {
 public:
  struct Settings {
    double lr = 1e-4;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
  };
  explicit AdamW(size_t n = 0) : m_(n, 0.0f), v_(n, 0.0f) {}
  /// One step: p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), moments from `g` (fp32, as
  /// PyTorch keeps them).
  void step(const std::vector<float*>& params, const std::vector<float*>& grads, const Settings& s);
  uint64_t steps() const { return t_; }
  /// The state, for checkpoints (runtime/train/checkpoint.h).
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  void set_steps(uint64_t t) { t_ = t; }

 private:
  std::vector<float> m_, v_;
  uint64_t t_ = 0;
};

/// One training example: the messages of one trace's choreographed run.
using Example = std::vector<GraphMessage>;

struct TrainSettings {
  int epochs = 2;
  int accumulate = 1;  // examples per optimiser step
  AdamW::Settings adam;
  uint64_t seed = 0;   // the order of the examples in each epoch
  /// Activation recomputation (Graph::set_recompute): Auto uses it for an example whose activations would
  /// exceed activation_budget bytes.
  enum class Recompute { Auto, On, Off } recompute = Recompute::Auto;
  size_t activation_budget = size_t(2) << 30;
};

/// What one epoch did: the mean log-loss per target token on the training examples (as they were trained,
/// before each step) and on the validation examples (after the epoch; NaN without any).
struct EpochReport {
  int epoch = 0;  // 1-based
  double train_loss = 0;
  double val_loss = 0;
  size_t steps = 0;  // optimiser steps so far
  size_t recomputed = 0;  // examples of the epoch trained with activation recomputation
};

/// Where a training run stands between epochs: what a checkpoint holds besides the LoRA values.
struct TrainState {
  AdamW adam;
  int epochs_done = 0;
};

/// The mean log-loss per target token of `examples` under `lora` (NaN when they have no target).
double mean_loss(const FrozenModel& model, const LoraParams<float>& lora, const std::vector<Example>& examples);

/// Trains `lora` in place, from `state` (a fresh one, or a checkpoint's: the epochs after state.epochs_done
/// run, in the order an uninterrupted run would have taken). `on_example` is called after each example (for
/// progress: epoch, index in the epoch, that example's loss per token); `on_epoch` after each epoch, with
/// `state` updated (a checkpoint).
void train(const FrozenModel& model, LoraParams<float>& lora, const std::vector<Example>& train_set,
           const std::vector<Example>& val_set, const TrainSettings& settings, TrainState& state,
           const std::function<void(int, size_t, double)>& on_example,
           const std::function<void(const EpochReport&)>& on_epoch);

}  // namespace choreo::train
