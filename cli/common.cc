#include "cli/common.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "dsl/budget.h"
#include "common/error.h"
#include "common/paths.h"
#include "runtime/kv/tier_config.h"

namespace choreo::cli {

namespace {
BackendChoice& backend_choice() {
  static BackendChoice choice;
  return choice;
}
}  // namespace

void add_backend_options(CLI::App& app, BackendChoice& choice) {
  app.add_option("--backend", choice.name,
                 "where the model runs: cpu (default); cuda (an NVIDIA GPU: built when nvcc is found, never run on a "
                 "GPU yet, see docs/cuda.md); cuda-emulated (the CUDA kernels on the CPU through the block emulator, "
                 "every launch checked: slow, for checking)")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emulated"}));
  app.add_option("--cuda-device", choice.cuda_device, "the GPU --backend cuda uses (default 0)")
      ->check(at_least(0));
}

void set_backend_choice(const BackendChoice& choice) { backend_choice() = choice; }

LoadedModel load_model(const std::string& path, int n_threads) {
  std::string p = path.empty() ? default_model_path() : path;
  if (!std::filesystem::exists(p)) {
    throw InputError(fmt::format("model file '{}' does not exist", p),
                     path.empty() ? "run scripts/setup.sh to fetch the default model, or pass -m MODEL.gguf"
                                  : "pass the path of a GGUF file with -m");
  }
  LoadedModel lm;
  lm.backend = kernels::make_backend(backend_choice().name, n_threads, backend_choice().cuda_device);
  lm.model = model::Model::load(p, *lm.backend);
  return lm;
}

model::LoraStack LoraOptions::load(const model::Model& base) const {
  model::LoraStack stack;
  for (const std::string& f : files) stack.adapters.emplace_back(model::LoraAdapter::load(f, base), 1.0f);
  for (size_t i = 0; i + 1 < scaled.size(); i += 2) {
    const std::string& f = scaled[i];
    const std::string& text = scaled[i + 1];
    float scale = 0.0f;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), scale);
    if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(scale))
      throw InputError(fmt::format("--lora-scaled {} {}: the scale is not a finite number", f, text),
                       "give the file, then the adapter's weight: --lora-scaled FILE 0.5");
    stack.adapters.emplace_back(model::LoraAdapter::load(f, base), scale);
  }
  return stack;
}

void add_lora_options(CLI::App& cmd, LoraOptions& lora) {
  cmd.add_option("--lora", lora.files, "LoRA adapter (llama.cpp's GGUF adapter format) applied with scale 1; repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--lora-scaled", lora.scaled, "LoRA adapter with its scale (FILE SCALE); repeatable")
      ->type_size(2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

std::map<std::string, std::string> key_values(const std::vector<std::string>& pairs, std::string_view flag) {
  std::map<std::string, std::string> out;
  for (const std::string& pair : pairs) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(fmt::format("{} '{}' is not KEY=VALUE", flag, pair),
                       fmt::format("write e.g. {} name=value", flag));
    if (!out.emplace(pair.substr(0, eq), pair.substr(eq + 1)).second)
      throw InputError(fmt::format("{} {} is given twice", flag, pair.substr(0, eq)));
  }
  return out;
}

void add_pairs_option(CLI::App& cmd, const std::string& name, std::vector<std::string>& values,
                      const std::string& help) {
  cmd.add_option(name, values, help)->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

CLI::Validator at_least(long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return fmt::format("'{}' is not a whole number", text);
        if (value < min) return fmt::format("must be at least {}, not {}", min, value);
        return {};
      },
      fmt::format("INT>={}", min));
}

std::pair<int, int> parse_layer_range(const std::string& text, std::string_view flag, int n_layers) {
  const auto bad = [&] {
    return InputError(fmt::format("{} '{}' is not FIRST-LAST or one layer", flag, text),
                      fmt::format("e.g. {} 10-14 (both included)", flag));
  };
  const auto number = [&](std::string_view part) {
    int v = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || v < 0) throw bad();
    return v;
  };
  const std::string_view all = text;
  const size_t dash = all.find('-');
  const int first = number(all.substr(0, dash));
  const int last = dash == std::string_view::npos ? first : number(all.substr(dash + 1));
  if (last < first) throw bad();
  if (n_layers > 0 && last >= n_layers)
    throw InputError(fmt::format("{} {}: the model has layers 0-{}", flag, text, n_layers - 1));
  return {first, last + 1};
}

void add_kv_options(CLI::App& cmd, KvOptions& kv) {
  cmd.add_option("--page-tokens", kv.page_tokens, "tokens per KV page (default 32)")
      ->check(CLI::Range(1, kernels::kMaxPageTokens));
  const auto check_type = [](const std::string& name) -> std::string {
    try {
      kernels::parse_kv_type(name);
      return {};
    } catch (const InputError& e) {
      return e.message();
    }
  };
  cmd.add_option("--cache-type-k", kv.type_k,
                 "KV cache type of keys: f32 (exact, the default), f16 or q8_0 (as llama.cpp's -ctk)")
      ->check(check_type);
  cmd.add_option("--cache-type-v", kv.type_v, "KV cache type of values: f32 (default), f16 or q8_0 (-ctv)")
      ->check(check_type);
}

kernels::KvLayout KvOptions::layout(const model::Model& model) const {
  return model.kv_layout(page_tokens, k_type(), v_type());
}

kv::TierSettings TierOptions::tiers() const {
  kv::TierSettings t{size_t(host_cache_mib) << 20, kv::parse_eviction_policy(evict), size_t(disk_cache_mib) << 20};
  t.prefetch_steps = size_t(prefetch_steps);
  t.write_through = write_through;
  return t;
}

void TierOptions::resolve() {
  const std::optional<kv::TierConfig> c = kv::read_tier_config(kv::tier_config_path());
  if (!c) return;
  // A flag the subcommand does not have (encode has only the Redis ones) takes the file's value.
  auto unset = [&](const char* flag) {
    const CLI::Option* option = app ? app->get_option_no_throw(flag) : nullptr;
    return !option || option->count() == 0;
  };
  if (c->cache_mib && unset("--cache-mib")) cache_mib = int(*c->cache_mib);
  if (c->host_cache_mib && unset("--host-cache-mib")) host_cache_mib = int(*c->host_cache_mib);
  if (c->disk_cache_mib && unset("--disk-cache-mib")) disk_cache_mib = int(*c->disk_cache_mib);
  if (c->evict && unset("--evict")) evict = *c->evict;
  if (c->redis && unset("--redis")) redis = *c->redis;
  if (c->redis_best_effort && unset("--redis-best-effort")) redis_best_effort = *c->redis_best_effort;
  if (c->prefetch_steps && unset("--prefetch-steps")) prefetch_steps = int(*c->prefetch_steps);
  if (c->write_through && unset("--write-through")) write_through = *c->write_through;
}

void add_redis_options(CLI::App& cmd, TierOptions& cache) {
  cache.app = &cmd;
  cmd.add_option("--redis", cache.redis,
                 "T3: share encodings through this Redis server (host:port; password from "
                 "$CHOREO_REDIS_PASSWORD): computed prefills are written to it, and misses read from it");
  cmd.add_flag("--redis-best-effort", cache.redis_best_effort,
               "when the Redis server cannot be used at start-up, warn and run without it");
}

void add_tier_options(CLI::App& cmd, TierOptions& cache) {
  cache.app = &cmd;
  cmd.add_option("--cache-mib", cache.cache_mib,
                 "T0 KV budget in MiB: the page pool attention reads (default 4096); when full, messages no "
                 "running call uses move to T1 or are dropped and recomputed if needed again")
      ->check(at_least(1));
  cmd.add_option("--host-cache-mib", cache.host_cache_mib,
                 "T1 KV budget in MiB: host memory keeping pages evicted from T0 (default 0: none)")
      ->check(at_least(0));
  cmd.add_option("--disk-cache-mib", cache.disk_cache_mib,
                 "T2 KV budget in MiB: pages evicted from T0 that T1 has no room for are written to the "
                 "persistent store (--cache-dir) and read back from it (default 0: the store is only read)")
      ->check(at_least(0));
  add_redis_options(cmd, cache);
  cmd.add_option("--evict", cache.evict,
                 "eviction policy: workflow (default; KVFlow: the message read the most steps from now goes "
                 "first) or lru")
      ->check(CLI::IsMember({"workflow", "lru"}));
  cmd.add_option("--prefetch-steps", cache.prefetch_steps,
                 "with --evict workflow: messages out of T0 that the workflow reads within this many steps are "
                 "loaded back from T1/T2 in the background, and calls still waiting for theirs run after ready "
                 "ones (default 2; 0: off)")
      ->check(CLI::Range(0, 1000));
  cmd.add_flag("--write-through", cache.write_through,
               "write every message to T2 (within --disk-cache-mib) when it is made, not when it is evicted");
}

store::RedisAddress TierOptions::redis_address() const {
  store::RedisAddress address = store::parse_redis_address(redis);
  if (const char* pw = std::getenv("CHOREO_REDIS_PASSWORD")) address.password = pw;
  return address;
}

std::unique_ptr<store::RedisStore> open_redis(const TierOptions& options) {
  if (options.redis.empty()) return nullptr;
  const store::RedisAddress address = options.redis_address();
  auto warn = [](const std::string& w) { std::fprintf(stderr, "warning: %s\n", w.c_str()); };
  try {
    return std::make_unique<store::RedisStore>(address, warn);
  } catch (const InputError& e) {
    if (!options.redis_best_effort) throw;
    warn(fmt::format("{} ({}); running without T3", e.message(), e.hint()));
    return nullptr;
  }
}

nlohmann::ordered_json tiers_json(const TierOptions& options, const kv::TierStats& s) {
  return {
      {"policy", options.evict},
      {"t0_budget_bytes", options.t0_bytes()},
      {"t1_budget_bytes", size_t(options.host_cache_mib) << 20},
      {"t0_peak_bytes", s.t0_peak_bytes},
      {"t1_peak_bytes", s.t1_peak_bytes},
      {"t0_evictions", s.t0_evictions},
      {"t1_offloads", s.t1_offloads},
      {"t1_offload_bytes", s.t1_offload_bytes},
      {"t1_hits", s.t1_hits},
      {"t1_load_bytes", s.t1_load_bytes},
      {"t1_load_tokens", s.t1_load_tokens},
      {"t1_evictions", s.t1_evictions},
      {"t2_budget_bytes", size_t(options.disk_cache_mib) << 20},
      {"t2_writes", s.t2_writes},
      {"t2_write_bytes", s.t2_write_bytes},
      {"t2_hits", s.t2_hits},
      {"t2_load_bytes", s.t2_load_bytes},
      {"t2_load_tokens", s.t2_load_tokens},
      {"t2_bad", s.t2_bad},
      {"t2_write_errors", s.t2_write_errors},
      {"t3_server", options.redis},
      {"t3_writes", s.t3_writes},
      {"t3_write_bytes", s.t3_write_bytes},
      {"t3_hits", s.t3_hits},
      {"t3_load_tokens", s.t3_load_tokens},
      {"t3_bad", s.t3_bad},
      {"prefetch_steps", options.evict == "workflow" ? options.prefetch_steps : 0},
      {"write_through", options.write_through},
      {"prefetches", s.prefetches},
      {"prefetch_bytes", s.prefetch_bytes},
      {"prefetch_used", s.prefetch_used},
      {"prefetch_wasted", s.prefetch_wasted},
      {"prefetch_bad", s.prefetch_bad},
      {"prefetch_wait_ms", s.prefetch_wait_ms},
      {"e_saved", s.e_saved},
      {"e_saved_bytes", s.e_saved_bytes},
      {"e_t1_offloads", s.e_t1_offloads},
      {"e_t1_offload_bytes", s.e_t1_offload_bytes},
      {"e_t1_loads", s.e_t1_loads},
      {"e_t1_load_bytes", s.e_t1_load_bytes},
      {"e_dropped", s.e_dropped},
      {"e_dropped_bytes", s.e_dropped_bytes},
      {"e_t2_writes", s.e_t2_writes},
      {"e_t2_write_bytes", s.e_t2_write_bytes},
      {"e_t3_writes", s.e_t3_writes},
      {"e_t3_write_bytes", s.e_t3_write_bytes},
      {"e_t2_loads", s.e_t2_loads},
      {"e_t2_load_bytes", s.e_t2_load_bytes},
      {"e_t3_loads", s.e_t3_loads},
      {"e_t3_load_bytes", s.e_t3_load_bytes},
      {"e_recomputed_tokens", s.e_recomputed_tokens},
      {"e_recompute_ms", s.e_recompute_ms},
      {"recomputes", s.recomputes},
      {"recomputed_tokens", s.recomputed_tokens},
      {"load_ms", s.load_ms},
  };
}

std::string tiers_line(const kv::TierStats& s) {
  return fmt::format(
      "cache: {} evictions from T0 (peak {:.1f} MiB); {} loads from T1 ({} tokens, peak {:.1f} MiB); {} "
      "writes to and {} loads from T2 ({} tokens{}); {} recomputes ({} tokens); {:.0f} ms loading{}",
      s.t0_evictions, s.t0_peak_bytes / 1048576.0, s.t1_hits, s.t1_load_tokens, s.t1_peak_bytes / 1048576.0,
      s.t2_writes, s.t2_hits, s.t2_load_tokens,
      s.t2_bad + s.t2_write_errors ? fmt::format(", {} bad entries, {} failed writes", s.t2_bad, s.t2_write_errors) : "",
      s.recomputes, s.recomputed_tokens, s.load_ms,
      s.t3_writes + s.t3_hits ? fmt::format("; T3: {} writes, {} loads ({} tokens)", s.t3_writes, s.t3_hits, s.t3_load_tokens)
                              : "") +
         (s.prefetches ? fmt::format("; {} prefetches ({} used, {} wasted, {:.0f} ms waited)", s.prefetches,
                                     s.prefetch_used, s.prefetch_wasted, s.prefetch_wait_ms)
                       : "") +
         (s.e_saved + s.e_recomputed_tokens
              ? fmt::format("; E caches: {} saved ({:.1f} MiB), {} to T1 and {} back, {} to T2/T3 and {} back, {} "
                            "dropped, {} tokens recomputed ({:.0f} ms)",
                            s.e_saved, s.e_saved_bytes / 1048576.0, s.e_t1_offloads, s.e_t1_loads,
                            s.e_t2_writes + s.e_t3_writes, s.e_t2_loads + s.e_t3_loads, s.e_dropped,
                            s.e_recomputed_tokens, s.e_recompute_ms)
              : "");
}

void add_max_steps_option(CLI::App& cmd, int64_t& max_steps) {
  cmd.add_option("--max-steps", max_steps,
                 fmt::format("work bound of the workflow: loop iterations and calls it may take (default {})",
                             dsl::kDefaultMaxSteps))
      ->check(at_least(1));
}

void add_model_options(CLI::App& cmd, std::string& model_path, int& n_threads) {
  cmd.add_option("-m,--model", model_path, "GGUF model file (default: $CHOREO_MODEL or the model setup installed)");
  cmd.add_option("-t,--threads", n_threads, "threads (default: all cores)")
      ->check(CLI::Range(0, kernels::kMaxThreads).description(fmt::format("0 (all cores) to {}", kernels::kMaxThreads)));
}

}  // namespace choreo::cli
