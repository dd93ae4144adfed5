#pragma once
// Pieces shared by the CLI's subcommands.

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "runtime/kv/tiers.h"
#include "runtime/store/redis_store.h"
#include "runtime/model/llama.h"

namespace choreo::cli {

/// A backend plus a loaded model, kept together so the model's backend reference stays valid.
struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::Model> model;
  model::LoraStack lora;  // the adapters every call runs with (--lora, --lora-scaled); empty: the base model
};

/// llama.cpp's adapter flags: `--lora FILE` (scale 1) and `--lora-scaled FILE SCALE`, both repeatable. The
/// adapters are stacked: the --lora ones in order, then the --lora-scaled ones in order.
struct LoraOptions {
  std::vector<std::string> files;
  std::vector<std::string> scaled;  // FILE SCALE FILE SCALE ...
  /// Opens and checks every adapter against `base` (InputError naming the file and the tensor).
  model::LoraStack load(const model::Model& base) const;
};
void add_lora_options(CLI::App& cmd, LoraOptions& lora);

/// Loads `path` (the default model when empty) on the backend chosen with --backend (the CPU's by default,
/// with n_threads threads; <= 0: all cores).
LoadedModel load_model(const std::string& path, int n_threads);

/// The options every command takes: `--backend cpu|cuda|cuda-emulated` and `--cuda-device N`.
struct BackendChoice {
  std::string name = "cpu";
  int cuda_device = 0;
};
void add_backend_options(CLI::App& app, BackendChoice& choice);
/// The choice load_model follows (set once, after the command line is parsed).
void set_backend_choice(const BackendChoice& choice);

/// `k=v` pairs from repeated flags (`--input`, `--param`, `--map`); a pair without `=` or a key given twice
/// is a usage error (InputError).
std::map<std::string, std::string> key_values(const std::vector<std::string>& pairs, std::string_view flag);

/// Adds a repeatable `KEY=VALUE` flag (`--input`, `--param`, `--map`): one value per occurrence, all kept;
/// parse the collected values with key_values().
void add_pairs_option(CLI::App& cmd, const std::string& name, std::vector<std::string>& values,
                      const std::string& help);

/// A check that an integer option is at least `min`, with a short message (CLI11's NonNegativeNumber and
/// PositiveNumber print the whole range of a double).
CLI::Validator at_least(long min);

/// `--layers FIRST-LAST` (inclusive) or `--layers N` as the half-open range [first, last + 1) (InputError
/// otherwise, naming `flag`); `n_layers` > 0 also refuses layers the model does not have.
std::pair<int, int> parse_layer_range(const std::string& text, std::string_view flag, int n_layers = 0);

/// The shape of an engine's KV pages: `--page-tokens` (tokens per page, 1 to kernels::kMaxPageTokens) and the
/// cache types `--cache-type-k` / `--cache-type-v` (llama.cpp's -ctk/-ctv: f32, f16 or q8_0).
struct KvOptions {
  int page_tokens = 32;
  std::string type_k = "f32";
  std::string type_v = "f32";
  kernels::DType k_type() const { return kernels::parse_kv_type(type_k); }
  kernels::DType v_type() const { return kernels::parse_kv_type(type_v); }
  /// The layout for this model; InputError when a type cannot hold its heads.
  kernels::KvLayout layout(const model::Model& model) const;
};
void add_kv_options(CLI::App& cmd, KvOptions& kv);

/// The KV tiers of an engine (runtime/kv/tiers.h, docs/store.md "Tiers"): `--cache-mib` (T0, the page pool
/// attention reads), `--host-cache-mib` (T1, host memory for pages evicted from T0), `--disk-cache-mib` (T2
/// writes to the persistent store) and `--evict` (policy).
struct TierOptions {
  int cache_mib = 4096;
  int host_cache_mib = 0;
  int disk_cache_mib = 0;
  std::string evict = "workflow";
  std::string redis;               // T3: host:port ("" for none); the password is $CHOREO_REDIS_PASSWORD
  bool redis_best_effort = false;  // a Redis that cannot be used at start-up is a warning, not an error
  int prefetch_steps = 2;          // with --evict workflow: prefetch what is read within this many steps
  bool write_through = false;      // T2 written when a message is made (else on eviction: write-back)
  const CLI::App* app = nullptr;   // the subcommand: which flags were given
  /// Takes what the command line left unset from choreo.toml (runtime/kv/tier_config.h).
  void resolve();
  size_t t0_bytes() const { return size_t(cache_mib) << 20; }
  /// `redis` parsed (InputError when malformed), with the password from $CHOREO_REDIS_PASSWORD.
  store::RedisAddress redis_address() const;
  kv::TierSettings tiers() const;
};
void add_tier_options(CLI::App& cmd, TierOptions& cache);
/// Adds only `--redis` and `--redis-best-effort` (part of add_tier_options), for commands with no tiers but T3.
void add_redis_options(CLI::App& cmd, TierOptions& cache);
/// Connects to the T3 server of `--redis` (null without one). A server that cannot be used is an InputError,
/// or with --redis-best-effort a warning and null. Mid-run failures are warnings (runtime/store/redis_store.h).
std::unique_ptr<store::RedisStore> open_redis(const TierOptions& options);
/// The tiers' settings and what they did, for --json.
nlohmann::ordered_json tiers_json(const TierOptions& options, const kv::TierStats& stats);
/// One line on what the tiers did ("cache: ...").
std::string tiers_line(const kv::TierStats& stats);

/// Adds `--max-steps` (the work bound of a workflow run or check: loop iterations and calls, dsl/budget.h).
void add_max_steps_option(CLI::App& cmd, int64_t& max_steps);

/// Adds `-m/--model` and `-t/--threads` to a subcommand.
void add_model_options(CLI::App& cmd, std::string& model_path, int& n_threads);

/// Subcommand registration, one per file.
void register_generate(CLI::App& app);
void register_finetune(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_model(CLI::App& app);
void register_bench(CLI::App& app);
void register_exec(CLI::App& app);
void register_run(CLI::App& app);
void register_encode(CLI::App& app);
void register_profile(CLI::App& app);
/// `choreo profile reuse` (cli/cmd_profile_reuse.cc), a subcommand of `profile`.
void register_profile_reuse(CLI::App& profile);
void register_check(CLI::App& app);
void register_eval(CLI::App& app);
/// Adds the run form `choreo eval WORKFLOW.yaml --data FILE ...` to the eval group (cli/cmd_eval_run.cc).
void add_eval_run(CLI::App& eval_group);
void register_cache(CLI::App& app);

}  // namespace choreo::cli
