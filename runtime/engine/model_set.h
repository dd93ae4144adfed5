#pragma once
// The models one engine runs calls on (DESIGN.md §2, §5, §6): a base GGUF, LoRA adapters over it, and other
// GGUF files of the same architecture. Each call names one by its index (PrefillRequest::model,
// DecodeRequest::model); every message records the model that encoded it, and content keys cover that
// model's weights, adapters and scales, so an encoding is never read by another model except through a
// cross-model plan.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <span>
#include <vector>

#include "runtime/model/llama.h"
#include "runtime/model/lora.h"

namespace choreo::runtime {

/// Layers [begin, end) of a model.
struct LayerRange {
  int begin = 0, end = 0;
  bool operator==(const LayerRange&) const = default;
};

/// What a model does with a message another model encoded (DESIGN.md §6, DroidSpeak).
struct CrossModelPlan {
  enum class Kind {
    Recompute,  // encode it again, whole, with the reader's model (exact; the default)
    Reuse,      // attend to the sender's KV as it is
    Partial,    // recompute the layers of `ranges`, each range from the sender's hidden state at its first
                // layer (its E cache); the sender's KV everywhere else
  };
  Kind kind = Kind::Recompute;
  /// Partial: the layers recomputed, ascending and disjoint. DroidSpeak prescribes one range (one
  /// transition); several ("scattered" layers) are what its Fig. 11 compares that with.
  std::vector<LayerRange> ranges;

  static CrossModelPlan partial(int begin, int end) { return {Kind::Partial, {{begin, end}}}; }
  /// "recompute", "reuse", "partial": what workflows and plan files call each kind.
  static std::string_view kind_name(Kind kind);
  /// The kind called `name`, or nullopt.
  static std::optional<Kind> parse_kind(std::string_view name);
  /// "recompute", "reuse", "partial [s, e)" or "partial [s, e) [s2, e2)".
  std::string describe() const;
  /// What content keys of encodings made with this plan add (0 for Recompute: the reader's own encoding).
  uint64_t fingerprint() const;
  /// The layers recomputed: every layer for Recompute, none for Reuse.
  int recomputed_layers(int n_layers) const;
};

/// One model calls can choose: weights with the adapters they run with.
struct EngineModel {
  std::string name;
  const model::Model* weights = nullptr;
  model::LoraStack lora;  // empty: the weights alone
  /// What its KV depends on: the weights file, and every adapter with its scale (the model's own fingerprint
  /// when there are no adapters).
  uint64_t fingerprint = 0;
  /// "name (file + adapter x scale ...)", for messages.
  std::string describe() const;
};

/// The models of one engine. Index 0 is the default: the model calls take when they name none.
class ModelSet {
 public:
  explicit ModelSet(const model::Model& base, model::LoraStack lora = {}, std::string name = "default");

  /// Adds a model calls can choose as `name`, and returns its index. `weights` is the base model's or another
  /// GGUF of the same architecture, shapes and vocabulary (a fine-tuned sibling); adapters must have been
  /// loaded for `weights`. InputError when the name is taken or empty, or when `weights` differs from the
  /// base in architecture, shape or vocabulary (naming both files and what differs).
  int add(std::string name, const model::Model& weights, model::LoraStack lora = {});

  size_t size() const { return models_.size(); }
  const EngineModel& operator[](size_t i) const { return models_[i]; }
  const EngineModel& base() const { return models_.front(); }
  /// The index of the model called `name`, or nullopt.
  std::optional<int> find(std::string_view name) const;
  /// The smallest training context of the models: where every model's positions end.
  int n_ctx() const;

  /// How `receiver` reads what `sender` encoded (default: Recompute). A Partial plan's ranges must lie in
  /// [0, n_layers], each with begin <= end, ascending and disjoint; InputError otherwise, naming both models.
  void set_plan(int sender, int receiver, CrossModelPlan plan);
  const CrossModelPlan& plan(int sender, int receiver) const;
  /// Makes `sender`'s encodings save their hidden states at these layers too (E caches no plan reads yet:
  /// the reuse profiler sets every plan it sweeps in turn over messages encoded once).
  void save_e_caches(int sender, std::vector<int> layers);
  /// The layers (ascending) at whose input `sender`'s encodings save their hidden states (the E cache): the
  /// first layer of each range of the plans reading it, and those of save_e_caches. Empty when none.
  std::vector<int> e_cache_layers(int sender) const;
  /// The same for a message that only `readers` will read (the compiled plan's calls reading it or anything
  /// encoded over it): the plans from `sender` to those of them that are other models, and save_e_caches.
  std::vector<int> e_cache_layers(int sender, std::span<const int> readers) const;

 private:
  std::vector<EngineModel> models_;
  std::vector<std::vector<CrossModelPlan>> plans_;  // [sender][receiver], grown on use
  std::vector<std::vector<int>> saved_e_caches_;    // [sender]: save_e_caches
};

/// The fingerprint of `weights` with `lora` (EngineModel::fingerprint).
uint64_t weights_fingerprint(const model::Model& weights, const model::LoraStack& lora);

}  // namespace choreo::runtime
