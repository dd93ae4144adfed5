#pragma once
// One way to open an engine (DESIGN.md §1): every front end (the CLI's commands, `eval`, and the long-lived
// `choreo serve`) loads its models with load_models and opens engines over them with open_engine, instead of
// assembling a backend, models, a page pool, tiers and stores by hand.
//
//   auto models = runtime::load_models({.path = "model.gguf", .adapters = {{"math.gguf", 1.0f}}});
//   auto opened = runtime::open_engine(models, {.t0_bytes = size_t(512) << 20});
//   opened->engine().decode(request);

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_set.h"
#include "runtime/kv/page_pool.h"
#include "runtime/kv/tiers.h"
#include "runtime/model/llama.h"
#include "runtime/model/lora.h"
#include "runtime/store/entry_store.h"
#include "runtime/store/redis_store.h"

namespace choreo::store {
class DiskStore;
}

namespace choreo::runtime {

/// A LoRA adapter file and its scale (llama.cpp's --lora and --lora-scaled).
struct AdapterFile {
  std::string path;
  float scale = 1.0f;
};

/// The models are loaded and set beside one another: what load_models adds after the base model.
struct ExtraModels {
  /// Owns weights other than the base model's that the set points to.
  std::vector<std::unique_ptr<model::Model>> owned;
};

/// What load_models loads.
struct ModelOptions {
  std::string path;               // the base GGUF; empty: the default model (common/paths.h)
  std::string backend = "cpu";    // kernels::make_backend: cpu, cuda, cuda-emulated
  int cuda_device = 0;
  int n_threads = 0;              // <= 0: every core
  std::vector<AdapterFile> adapters;  // stacked over the base model in order: model 0 of the set
  /// More models for calls to choose (a workflow's `models:`, exec's --lora-modules and --model-file), added
  /// to the set once the base model and its adapters are loaded; weights it loads go to `extra.owned`.
  std::function<void(const model::Model& base, ModelSet& set, ExtraModels& extra)> add_models;
};

/// A backend, the weights on it, and the model set engines run calls on. Engines keep references into it:
/// it must outlive them (open_engine shares its ownership).
struct LoadedModels {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::Model> base;
  model::LoraStack base_lora;  // the adapters of model 0
  ExtraModels extra;
  std::optional<ModelSet> set;
  const model::Model& model() const { return *base; }
  const ModelSet& models() const { return *set; }
};

/// Loads the base model on the chosen backend, its adapters, then the extra models. InputError for a missing
/// or bad file, naming it.
std::shared_ptr<LoadedModels> load_models(const ModelOptions& options);

/// The persistent and shared stores below T1 (runtime/engine/tiers.h).
struct StoreOptions {
  /// T2: a store directory; nullopt: none. With `disk_create` the directory is created (or adopted) for
  /// writing; otherwise it must exist and is only written by eviction when TierSettings::disk_bytes allows.
  std::optional<std::string> disk_dir;
  bool disk_create = false;
  std::string key_file;            // store key (--store-key-file); empty: $CHOREO_STORE_KEY_FILE, or none
  bool persist_prefills = false;   // every computed prefill is written to T2 with its ancestors
  /// T3: a Redis server; nullopt: none. A server that cannot be used at start-up is an InputError, or with
  /// `redis_best_effort` a warning and no T3.
  std::optional<store::RedisAddress> redis;
  bool redis_best_effort = false;
  /// Where warnings go (unusable entries, a server going away); default: stderr, one line each.
  store::WarningSink warn;
};

/// What open_engine opens over loaded models.
struct EngineOptions {
  Mode mode = Mode::Choreo;
  int page_tokens = 32;                         // tokens per KV page
  kernels::DType k_type = kernels::DType::F32;  // KV cache types (llama.cpp's -ctk / -ctv)
  kernels::DType v_type = kernels::DType::F32;
  /// T0: the page pool's budget. nullopt: 8 GiB, or the device's free memory when that is less (a budget
  /// meant as "no limit").
  std::optional<size_t> t0_bytes;
  kv::TierSettings tiers;
  StoreOptions stores;  // used in choreo mode only: the baselines stand for serving without a kept cache
  int max_batch = 512;  // tokens per forward pass
  /// A repair policy for every call, over the workflow's and the calls' own (Engine::set_repair); nullopt:
  /// theirs. One other than none needs choreo mode (InputError).
  std::optional<RepairPolicy> repair;
};

/// An engine and everything it runs on: its page pool and stores, and the models (shared, or borrowed).
class OpenedEngine {
 public:
  OpenedEngine(std::shared_ptr<const LoadedModels> models, const EngineOptions& options);
  /// Over models the caller keeps alive as long as the engine: `models`' weights and backend.
  OpenedEngine(const ModelSet& models, const EngineOptions& options);
  ~OpenedEngine();
  OpenedEngine(const OpenedEngine&) = delete;
  OpenedEngine& operator=(const OpenedEngine&) = delete;

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  /// The base model's weights.
  const model::Model& model() const { return engine_->model(); }
  kv::PagePool& pool() { return *pool_; }
  /// The T2 store (null: none).
  store::DiskStore* disk() { return disk_.get(); }
  /// The T3 store (null: none).
  store::RedisStore* redis() { return redis_.get(); }
  const EngineOptions& options() const { return options_; }

 private:
  void open(const ModelSet& models);

  std::shared_ptr<const LoadedModels> models_;  // null when borrowed
  EngineOptions options_;
  std::unique_ptr<kv::PagePool> pool_;
  std::unique_ptr<store::DiskStore> disk_;
  std::unique_ptr<store::RedisStore> redis_;
  std::unique_ptr<Engine> engine_;  // last: destroyed first
};

/// Opens an engine over loaded models.
std::unique_ptr<OpenedEngine> open_engine(std::shared_ptr<const LoadedModels> models, const EngineOptions& options);
/// Opens an engine over models the caller keeps alive as long as the engine.
std::unique_ptr<OpenedEngine> open_engine(const ModelSet& models, const EngineOptions& options);
/// Loads the models and opens one engine over them.
std::unique_ptr<OpenedEngine> open_engine(const ModelOptions& models, const EngineOptions& options);

/// Runs one short prefill on a scratch engine over `models` (page faults on the weights, thread start), so
/// that timed runs do not pay for them; neither cache of a later engine sees it.
void warm_up(const ModelSet& models, int page_tokens = 32);

}  // namespace choreo::runtime
