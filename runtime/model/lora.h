#pragma once
// LoRA adapters in llama.cpp's GGUF adapter format, applied at run time without merging (DESIGN.md §6):
// each adapted weight W gets y = W·x + s·B·(A·x). The file has `general.type = adapter`,
// `adapter.type = lora`, `adapter.lora.alpha`, and for each adapted base tensor `T.weight` the pair
// `T.weight.lora_a` (ggml shape [n_in, rank]) and `T.weight.lora_b` ([rank, n_out]). As in llama.cpp, the scale
// s of a pair is user_scale * alpha / rank, or user_scale when alpha is 0.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/gguf.h"

namespace choreo::model {

class Model;

/// The base weights an adapter may adapt: a layer's seven projections, and the output projection.
enum class LoraTarget : int { Q, K, V, O, Gate, Up, Down, Output };
inline constexpr int kLoraTargets = 8;

/// One adapted weight: A maps the base weight's input to `rank` values, B maps those to its output.
struct LoraPair {
  kernels::Weight a;  ///< rank rows of n_in (ggml [n_in, rank])
  kernels::Weight b;  ///< n_out rows of rank (ggml [rank, n_out])
  float alpha = 0.0f;  ///< the adapter's adapter.lora.alpha (0: none)
  int rank() const { return int(a.n_out); }
  /// llama.cpp's scale of the pair's product: user_scale * alpha / rank, or user_scale when alpha is 0.
  float scale(float user_scale) const { return alpha != 0.0f ? user_scale * alpha / float(rank()) : user_scale; }
};

/// A loaded adapter, checked against the base model it was opened for.
class LoraAdapter {
 public:
  /// Opens `path` and checks it against `base`: a GGUF adapter of type lora for the base's architecture,
  /// every tensor a `.lora_a`/`.lora_b` pair of one base tensor that exists, with matching shapes and a rank
  /// of at least 1. Anything else is an InputError naming the file and the tensor (exit code 2).
  static std::shared_ptr<const LoraAdapter> load(const std::string& path, const Model& base);
  /// The same over a GGUF already opened or parsed (gguf::File::parse: its buffer must outlive the adapter).
  static std::shared_ptr<const LoraAdapter> load(gguf::File file, const Model& base);

  const std::string& path() const { return file_.path(); }
  /// adapter.lora.alpha (0 when absent).
  float alpha() const { return alpha_; }
  /// The pair adapting `t` of `layer` (layer ignored for Output), or null.
  const LoraPair* find(int layer, LoraTarget t) const;
  int n_pairs() const { return n_pairs_; }
  int max_rank() const { return max_rank_; }
  /// XXH3 of the whole file: with the scale, what content keys cover.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  explicit LoraAdapter(gguf::File file) : file_(std::move(file)) {}
  gguf::File file_;
  float alpha_ = 0.0f;
  int n_pairs_ = 0;
  int max_rank_ = 0;
  uint64_t fingerprint_ = 0;
  std::vector<std::array<std::optional<LoraPair>, kLoraTargets - 1>> layers_;
  std::optional<LoraPair> output_;
};

/// Adapters applied together, in order, each with its user scale (llama.cpp's `--lora-scaled FILE SCALE`;
/// `--lora FILE` is scale 1). An empty stack is the base model.
struct LoraStack {
  std::vector<std::pair<std::shared_ptr<const LoraAdapter>, float>> adapters;
  bool empty() const { return adapters.empty(); }
  /// What content keys and store fingerprints add for this stack: every adapter's fingerprint and the bits
  /// of its scale, in order; 0 for the base model.
  uint64_t fingerprint() const;
};

}  // namespace choreo::model
