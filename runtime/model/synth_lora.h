#pragma once
// Random-weight LoRA adapters for tests (`choreo model synth-lora`): an adapter in llama.cpp's GGUF format
// (runtime/model/lora.h) for a given base model, touching only chosen layers and projections. The cross-model
// reuse profiler's tests use one concentrated on a block of layers to check that the profiler finds it.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/model/lora.h"

namespace choreo::model {

class Model;

/// What a synthetic adapter adapts and how strongly.
struct SynthLoraSpec {
  int first_layer = 0;
  int end_layer = -1;  ///< layers [first_layer, end_layer) are adapted (-1: to the last)
  int rank = 8;
  float alpha = 16.0f;  ///< adapter.lora.alpha: the pair's scale is alpha / rank
  std::vector<LoraTarget> targets = {LoraTarget::Q,    LoraTarget::K,  LoraTarget::V,   LoraTarget::O,
                                     LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};
  /// Standard deviation of B's entries; A's are 1/sqrt(n_in), so that A·x is about unit size for a
  /// normalised x and the pair adds about strength·sqrt(rank)·alpha/rank per output.
  float strength = 0.02f;
  uint64_t seed = 1;
};

/// Parses "q,k,v,o,gate,up,down" (any subset, in any order); InputError naming the bad name.
std::vector<LoraTarget> parse_lora_targets(const std::string& list);

/// `--layers FIRST-LAST` (inclusive) or `--layers N`, the adapted layers, as the half-open range
/// [first, last + 1) (InputError otherwise, naming `flag`); `n_layers` > 0 also refuses layers the model does
/// not have.
std::pair<int, int> parse_layer_range(const std::string& text, std::string_view flag, int n_layers = 0);

/// Writes the adapter to `path` (crash-safe), F32 pairs for every adapted weight of `base`. InputError for
/// layers outside the model, a rank below 1 or above the smaller dimension, or no targets.
void write_synthetic_lora(const Model& base, const SynthLoraSpec& spec, const std::string& path);

}  // namespace choreo::model
