#include "runtime/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace choreo::train {

void AdamW::step(const std::vector<float*>& params, const std::vector<float*>& grads, const Settings& s) {
  ++t_;
  const double c1 = 1.0 - std::pow(s.beta1, double(t_)), c2 = 1.0 - std::pow(s.beta2, double(t_));
  for (size_t i = 0; i < params.size(); ++i) {
    const double g = *grads[i];
    m_[i] = float(s.beta1 * m_[i] + (1 - s.beta1) * g);
    v_[i] = float(s.beta2 * v_[i] + (1 - s.beta2) * g * g);
    const double update =
        (double(m_[i]) / c1) / (std::sqrt(double(v_[i]) / c2) + s.eps) + s.weight_decay * double(*params[i]);
    *params[i] = float(double(*params[i]) - s.lr * update);
  }
}

namespace {

size_t tokens_of(const Example& e) {
  size_t n = 0;
  for (const GraphMessage& m : e) n += m.tokens.size();
  return n;
}

int targets_of(const Example& e) {
  int n = 0;
  for (const GraphMessage& m : e)
    for (int32_t t : m.targets) n += t >= 0;
  return n;
}

}  // namespace

double mean_loss(const FrozenModel& model, const LoraParams<float>& lora, const std::vector<Example>& examples) {
  double loss = 0;
  int n = 0;
  for (const Example& e : examples) {
    Graph<float> g(model, lora);
    g.set_recompute(true);  // no backward: nothing needs the intermediates
    for (const GraphMessage& m : e) g.add(m);
    loss += g.forward();
    n += targets_of(e);
  }
  return n > 0 ? loss / n : std::numeric_limits<double>::quiet_NaN();
}

void train(const FrozenModel& model, LoraParams<float>& lora, const std::vector<Example>& train_set,
           const std::vector<Example>& val_set, const TrainSettings& settings, TrainState& state,
           const std::function<void(int, size_t, double)>& on_example,
           const std::function<void(const EpochReport&)>& on_epoch) {
  AdamW& adam = state.adam;
  if (adam.m().size() != lora.size()) adam = AdamW(lora.size());
  LoraParams<float> grads = lora.zeros_like();
  std::vector<float*> params = lora.values(), grad_values = grads.values();
  std::vector<size_t> order(train_set.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::mt19937_64 rng(settings.seed);
  const int accumulate = std::max(1, settings.accumulate);
  for (int epoch = 1; epoch <= state.epochs_done; ++epoch) std::shuffle(order.begin(), order.end(), rng);
  for (int epoch = state.epochs_done + 1; epoch <= settings.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    double epoch_loss = 0;
    int epoch_targets = 0, pending = 0;
    size_t recomputed = 0;
    const auto apply = [&] {
      if (pending == 0) return;
      for (float* g : grad_values) *g /= float(pending);
      adam.step(params, grad_values, settings.adam);
      for (float* g : grad_values) *g = 0.0f;
      pending = 0;
    };
    for (size_t k = 0; k < order.size(); ++k) {
      const Example& e = train_set[order[k]];
      Graph<float> g(model, lora);
      const bool recompute =
          settings.recompute == TrainSettings::Recompute::On ||
          (settings.recompute == TrainSettings::Recompute::Auto &&
           Graph<float>::activation_bytes(model, lora.rank, tokens_of(e), false) > settings.activation_budget);
      g.set_recompute(recompute);
      recomputed += recompute;
      for (const GraphMessage& m : e) g.add(m);
      const double loss = g.forward();
      g.backward(grads);
      const int n = targets_of(e);
      epoch_loss += loss;
      epoch_targets += n;
      if (on_example) on_example(epoch, k, n > 0 ? loss / n : 0.0);
      if (++pending == accumulate) apply();
    }
    apply();
    EpochReport r{epoch, epoch_targets > 0 ? epoch_loss / epoch_targets : std::numeric_limits<double>::quiet_NaN(),
                  mean_loss(model, lora, val_set), size_t(adam.steps()), recomputed};
    state.epochs_done = epoch;
    if (on_epoch) on_epoch(r);
  }
}

}  // namespace choreo::train
