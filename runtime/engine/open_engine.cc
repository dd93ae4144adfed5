#include "runtime/engine/open_engine.h"

#include <cstdio>
#include <filesystem>

#include "common/error.h"
#include "common/paths.h"
#include "runtime/store/disk_store.h"

namespace choreo::runtime {

namespace {

/// The budget of a pool no option sets: meant as "no limit", within the device's memory.
constexpr size_t kUnlimitedT0Bytes = size_t(8) << 30;

store::WarningSink warnings_or_stderr(store::WarningSink warn) {
  if (warn) return warn;
  return [](const std::string& line) { std::fprintf(stderr, "warning: %s\n", line.c_str()); };
}

}  // namespace

std::shared_ptr<LoadedModels> load_models(const ModelOptions& options) {
  const std::string path = options.path.empty() ? default_model_path() : options.path;
  if (!std::filesystem::exists(path))
    throw InputError(fmt::format("model file '{}' does not exist", path),
                     options.path.empty() ? "run scripts/setup.sh to fetch the default model, or pass -m MODEL.gguf"
                                          : "pass the path of a GGUF file with -m");
  auto loaded = std::make_shared<LoadedModels>();
  loaded->backend = kernels::make_backend(options.backend, options.n_threads, options.cuda_device);
  loaded->base = model::Model::load(path, *loaded->backend);
  for (const AdapterFile& a : options.adapters)
    loaded->base_lora.adapters.emplace_back(model::LoraAdapter::load(a.path, *loaded->base), a.scale);
  loaded->set.emplace(*loaded->base, loaded->base_lora);
  if (options.add_models) options.add_models(*loaded->base, *loaded->set, loaded->extra);
  return loaded;
}

OpenedEngine::OpenedEngine(std::shared_ptr<const LoadedModels> models, const EngineOptions& options)
    : models_(std::move(models)), options_(options) {
  open(models_->models());
}

OpenedEngine::OpenedEngine(const ModelSet& models, const EngineOptions& options) : options_(options) {
  open(models);
}

void OpenedEngine::open(const ModelSet& models) {
  const EngineOptions& options = options_;
  const model::Model& base = *models.base().weights;
  kernels::Backend& backend = base.backend();
  const size_t t0_bytes =
      options.t0_bytes ? *options.t0_bytes : kv::budget_within_device(backend, kUnlimitedT0Bytes);
  pool_ = std::make_unique<kv::PagePool>(backend, base.kv_layout(options.page_tokens, options.k_type, options.v_type),
                                         t0_bytes);
  engine_ = std::make_unique<Engine>(models, *pool_, options.mode, options.max_batch);
  engine_->set_tiers(options.tiers);
  if (options.repair && !options.repair->none() && options.mode != Mode::Choreo)
    throw InputError(fmt::format("repair policy {} in {} mode: only choreo mode reads cached parents out of "
                                 "their prefix position",
                                 options.repair->name(), mode_name(options.mode)),
                     "use --mode choreo, or leave --repair out");
  engine_->set_repair(options.repair);
  if (options.mode != Mode::Choreo) return;  // the baselines keep nothing between runs
  const StoreOptions& s = options.stores;
  const store::WarningSink warn = warnings_or_stderr(s.warn);
  if (s.disk_dir) {
    disk_ = std::make_unique<store::DiskStore>(*s.disk_dir, s.disk_create, warn,
                                               store::configured_authenticator(s.key_file));
    engine_->add_store(*disk_, {.evictions = true, .persist = true, .persist_prefills = s.persist_prefills});
  }
  if (s.redis) {
    // The largest value this engine could use: an entry's pages and E caches are charged to T0.
    store::RedisLimits limits;
    limits.max_value_bytes = uint64_t(t0_bytes) + (uint64_t(1) << 20);
    try {
      redis_ = std::make_unique<store::RedisStore>(*s.redis, warn, limits, store::configured_authenticator(s.key_file));
    } catch (const InputError& e) {
      if (!s.redis_best_effort) throw;
      warn(fmt::format("{} ({}); running without T3", e.message(), e.hint()));
    }
    if (redis_) {
      if (!redis_->keyed())
        warn(fmt::format("T3 (Redis at {}) is not authenticated: anyone who can write to that server can change "
                         "what this run loads; set CHOREO_STORE_KEY_FILE to sign and check its values "
                         "(docs/store.md, \"Threat model\")",
                         redis_->where()));
      engine_->add_store(*redis_, {.prefills = true});
    }
  }
}

OpenedEngine::~OpenedEngine() = default;

std::unique_ptr<OpenedEngine> open_engine(std::shared_ptr<const LoadedModels> models, const EngineOptions& options) {
  return std::make_unique<OpenedEngine>(std::move(models), options);
}

std::unique_ptr<OpenedEngine> open_engine(const ModelSet& models, const EngineOptions& options) {
  return std::make_unique<OpenedEngine>(models, options);
}

std::unique_ptr<OpenedEngine> open_engine(const ModelOptions& models, const EngineOptions& options) {
  return open_engine(load_models(models), options);
}

void warm_up(const ModelSet& models, int page_tokens) {
  const model::Model& base = *models.base().weights;
  kv::PagePool pool(base.backend(), base.kv_layout(page_tokens),
                    kv::budget_within_device(base.backend(), size_t(64) << 20));
  Engine scratch(models, pool, Mode::Choreo);
  PrefillRequest request;
  request.tokens = base.vocab().tokenize("Warm up the weights and the threads, please.", false, true);
  if (!request.tokens.empty()) scratch.prefill(request);
}

}  // namespace choreo::runtime
