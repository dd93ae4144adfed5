#pragma once
// The flags that say how an engine is opened, declared once for every command that takes them (one CLI11
// option group, "Engine"), and turned into the options of runtime::load_models and runtime::open_engine. A
// command picks the parts it has: a model (-m, -t), adapters, the KV page shape, the T0 budget, the tiers
// below it, Redis, and the persistent store.

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/engine/open_engine.h"
#include "runtime/kv/tiers.h"

namespace choreo::cli {

/// Which persistent store (T2) a command's choreo-mode engine uses.
enum class StorePolicy {
  None,      // none
  Explicit,  // --cache-dir, or the default store when --disk-cache-mib asks for T2 writes (eval, exec)
  Default,   // also the default store when it exists, read-only unless T2 writes are asked for (run)
  Writable,  // the default store or --cache-dir, created for writing (encode)
};

/// The engine flags of one command.
struct EngineFlags {
  /// The parts a command takes (or'ed).
  enum Part : unsigned {
    kModel = 1 << 0,   // -m/--model, -t/--threads
    kLora = 1 << 1,    // --lora, --lora-scaled
    kKv = 1 << 2,      // --page-tokens, --cache-type-k, --cache-type-v
    kCache = 1 << 3,   // --cache-mib (T0)
    kTiers = 1 << 4,   // --host-cache-mib, --disk-cache-mib, --evict, --prefetch-steps, --write-through
    kRedis = 1 << 5,   // --redis, --redis-best-effort (T3)
    kStore = 1 << 6,   // --cache-dir, --no-store, --store-key-file (T2)
    kRepair = 1 << 7,  // --repair
  };

  std::string model_path;
  int n_threads = 0;
  std::vector<std::string> lora_files;
  std::vector<std::string> lora_scaled;  // FILE SCALE FILE SCALE ...
  int page_tokens = 32;
  std::string type_k = "f32", type_v = "f32";
  int cache_mib = 4096;
  int host_cache_mib = 0;
  int disk_cache_mib = 0;
  std::string evict = "workflow";
  int prefetch_steps = 2;
  bool write_through = false;
  std::string redis;               // host:port ("" for none); the password is $CHOREO_REDIS_PASSWORD
  bool redis_best_effort = false;
  std::string cache_dir;
  bool no_store = false;
  std::string store_key_file;
  std::string repair;  // "" when not given

  /// Declares the parts' flags on `cmd` in the "Engine" group.
  void add(CLI::App& cmd, unsigned parts);
  /// Takes what the command line left unset from choreo.toml (runtime/kv/tier_config.h); call it once the
  /// command line is parsed.
  void resolve();

  /// The models to load: -m (or `model_path` when -m is not given; empty: the default model), on the
  /// --backend chosen, with -t threads and the adapters of --lora and --lora-scaled.
  runtime::ModelOptions model_options(const std::string& fallback_path = {}) const;
  /// The engine to open in `mode`, its stores chosen by `policy`.
  runtime::EngineOptions engine_options(runtime::Mode mode, StorePolicy policy) const;
  /// The tiers of --host-cache-mib, --disk-cache-mib, --evict, --prefetch-steps and --write-through.
  kv::TierSettings tiers() const;
  size_t t0_bytes() const { return size_t(cache_mib) << 20; }
  /// The KV page layout of --page-tokens and the cache types for `model`; InputError when a type cannot hold
  /// its heads.
  kernels::KvLayout kv_layout(const model::Model& model) const;

  /// The tiers' settings and what they did, for --json.
  nlohmann::ordered_json tiers_json(const kv::TierStats& stats) const;

 private:
  void add_model_flags(CLI::Option_group& g);
  void add_lora_flags(CLI::Option_group& g);
  void add_kv_flags(CLI::Option_group& g);
  void add_tier_flags(CLI::Option_group& g);
  void add_store_flags(CLI::Option_group& g);

  unsigned parts_ = 0;
  const CLI::App* app_ = nullptr;
};

/// Models calls and requests choose by name, after the run's model: NAME=ADAPTER.gguf (the run's model with that
/// adapter, scale 1; --lora-modules) and NAME=MODEL.gguf (another GGUF of the same architecture; --model-file).
void add_named_models(const std::vector<std::string>& lora_modules, const std::vector<std::string>& model_files,
                      const model::Model& base, runtime::ModelSet& set, runtime::ExtraModels& extra);
/// Declares --lora-modules and --model-file on `cmd`; `what` says who chooses ("calls", "requests").
void add_named_model_flags(CLI::App& cmd, std::vector<std::string>& lora_modules,
                           std::vector<std::string>& model_files, const std::string& chosen_with);

/// One line on what the tiers did ("cache: ...").
std::string tiers_line(const kv::TierStats& stats);

}  // namespace choreo::cli
