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
#include <vector>

#include "runtime/model/llama.h"
#include "runtime/model/lora.h"

namespace choreo::runtime {

/// What a model does with a message another model encoded (DESIGN.md §6, DroidSpeak).
struct CrossModelPlan {
  enum class Kind {
    Recompute,  // encode it again, whole, with the reader's model (exact; the default)
    Reuse,      // attend to the sender's KV as it is
    Partial,    // recompute layers [begin, end) from the sender's hidden state at `begin` (its E cache);
                // the sender's KV everywhere else
  };
  Kind kind = Kind::Recompute;
  int begin = 0, end = 0;  // Partial: the layers recomputed
  /// "recompute", "reuse" or "partial [s, e)".
  std::string describe() const;
  /// What content keys of encodings made with this plan add (0 for Recompute: the reader's own encoding).
  uint64_t fingerprint() const;
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

  /// How `receiver` reads what `sender` encoded (default: Recompute). A Partial plan's layers must lie in
  /// [0, n_layers] with begin <= end; plans from one sender that save an E cache must agree on its layer
  /// (one hidden state per message). InputError otherwise, naming both models.
  void set_plan(int sender, int receiver, CrossModelPlan plan);
  const CrossModelPlan& plan(int sender, int receiver) const;
  /// The layer at whose input `sender`'s encodings save their hidden states (the E cache), or -1 when no
  /// plan reads them.
  int e_cache_layer(int sender) const;

 private:
  std::vector<EngineModel> models_;
  std::vector<std::vector<CrossModelPlan>> plans_;  // [sender][receiver], grown on use
};

/// The fingerprint of `weights` with `lora` (EngineModel::fingerprint).
uint64_t weights_fingerprint(const model::Model& weights, const model::LoraStack& lora);

}  // namespace choreo::runtime
