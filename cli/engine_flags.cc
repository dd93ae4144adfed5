#include "cli/engine_flags.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "cli/common.h"
#include "common/error.h"
#include "common/repair_policy.h"
#include "runtime/eval/repair_sweep.h"
#include "runtime/kv/tier_config.h"
#include "runtime/store/cache_dir.h"

namespace choreo::cli {

namespace {

/// --repair's value: a policy, or a policy file (`profile quality --sweep -o DIR`'s repair.json).
RepairPolicy repair_from_flag(const std::string& text) {
  if (text.ends_with(".json")) return eval::read_repair_policy_file(text);
  return parse_repair_policy(text);
}

std::string check_repair(const std::string& text) {
  try {
    repair_from_flag(text);
    return {};
  } catch (const InputError& e) {
    return e.message() + "; " + e.hint();
  }
}

std::string check_kv_type(const std::string& name) {
  try {
    kernels::parse_kv_type(name);
    return {};
  } catch (const InputError& e) {
    return e.message();
  }
}

/// --lora-scaled's FILE SCALE pairs.
std::vector<runtime::AdapterFile> scaled_adapters(const std::vector<std::string>& scaled) {
  std::vector<runtime::AdapterFile> out;
  for (size_t i = 0; i + 1 < scaled.size(); i += 2) {
    const std::string& file = scaled[i];
    const std::string& text = scaled[i + 1];
    float scale = 0.0f;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), scale);
    if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(scale))
      throw InputError(fmt::format("--lora-scaled {} {}: the scale is not a finite number", file, text),
                       "give the file, then the adapter's weight: --lora-scaled FILE 0.5");
    out.push_back({file, scale});
  }
  return out;
}

}  // namespace

void EngineFlags::add(CLI::App& cmd, unsigned parts) {
  parts_ = parts;
  app_ = &cmd;
  CLI::Option_group& g = *cmd.add_option_group("Engine", "how the model and its KV cache are set up");
  if (parts & kModel) add_model_flags(g);
  if (parts & kLora) add_lora_flags(g);
  if (parts & kKv) add_kv_flags(g);
  if (parts & kCache)
    g.add_option("--cache-mib", cache_mib,
                 "T0 KV budget in MiB: the page pool attention reads (default 4096); when full, messages no "
                 "running call uses move to T1 or are dropped and recomputed if needed again")
        ->check(at_least(1));
  if (parts & kTiers) add_tier_flags(g);
  if (parts & kRedis) {
    g.add_option("--redis", redis,
                 "T3: share encodings through this Redis server (host:port; password from "
                 "$CHOREO_REDIS_PASSWORD): computed prefills are written to it, and misses read from it");
    g.add_flag("--redis-best-effort", redis_best_effort,
               "when the Redis server cannot be used at start-up, warn and run without it");
  }
  if (parts & kStore) add_store_flags(g);
  if (parts & kRepair)
    g.add_option(
         "--repair", repair,
         "repair the KV of cached parents each call reads out of its exact prefix position, for every "
         "call (over the workflow's `repair:`): none, first:K (recompute each such parent's first K "
         "tokens in the call's context; EPIC) or select:R (the fraction R of their tokens whose KV "
         "deviates most; CacheBlend), or FILE.json: the policy `profile quality --sweep -o DIR` chose; "
         "docs/profile.md")
        ->check(check_repair);
}

void EngineFlags::add_model_flags(CLI::Option_group& g) {
  g.add_option("-m,--model", model_path, "GGUF model file (default: $CHOREO_MODEL or the model setup installed)");
  g.add_option("-t,--threads", n_threads, "threads (default: all cores)")
      ->check(CLI::Range(0, kernels::kMaxThreads).description(fmt::format("0 (all cores) to {}", kernels::kMaxThreads)));
}

void EngineFlags::add_lora_flags(CLI::Option_group& g) {
  // One value (two for --lora-scaled) per occurrence: a positional argument after it is not taken.
  g.add_option("--lora", lora_files, "LoRA adapter (llama.cpp's GGUF adapter format) applied with scale 1; repeatable")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g.add_option("--lora-scaled", lora_scaled, "LoRA adapter with its scale (FILE SCALE); repeatable")
      ->type_size(2)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void EngineFlags::add_kv_flags(CLI::Option_group& g) {
  g.add_option("--page-tokens", page_tokens, "tokens per KV page (default 32)")
      ->check(CLI::Range(1, kernels::kMaxPageTokens));
  g.add_option("--cache-type-k", type_k, "KV cache type of keys: f32 (exact, the default), f16 or q8_0 (as llama.cpp's -ctk)")
      ->check(check_kv_type);
  g.add_option("--cache-type-v", type_v, "KV cache type of values: f32 (default), f16 or q8_0 (-ctv)")
      ->check(check_kv_type);
}

void EngineFlags::add_tier_flags(CLI::Option_group& g) {
  g.add_option("--host-cache-mib", host_cache_mib,
               "T1 KV budget in MiB: host memory keeping pages evicted from T0 (default 0: none)")
      ->check(at_least(0));
  g.add_option("--disk-cache-mib", disk_cache_mib,
               "T2 KV budget in MiB: pages evicted from T0 that T1 has no room for are written to the "
               "persistent store (--cache-dir) and read back from it (default 0: the store is only read)")
      ->check(at_least(0));
  g.add_option("--evict", evict,
               "eviction policy: workflow (default; KVFlow: the message read the most steps from now goes first) "
               "or lru")
      ->check(CLI::IsMember({"workflow", "lru"}));
  g.add_option("--prefetch-steps", prefetch_steps,
               "with --evict workflow: messages out of T0 that the workflow reads within this many steps are "
               "loaded back from T1/T2 in the background, and calls still waiting for theirs run after ready "
               "ones (default 2; 0: off)")
      ->check(CLI::Range(0, 1000));
  g.add_flag("--write-through", write_through,
             "write every message to T2 (within --disk-cache-mib) when it is made, not when it is evicted");
}

void EngineFlags::add_store_flags(CLI::Option_group& g) {
  g.add_option("--cache-dir", cache_dir,
               "persistent store directory, T2 (default: $CHOREO_CACHE_DIR, else the XDG cache dir; `run` reads it "
               "when it exists, `encode` writes it, `eval` and `exec` use it only when given or with "
               "--disk-cache-mib; docs/store.md)");
  g.add_flag("--no-store", no_store, "do not use the persistent store");
  g.add_option("--store-key-file", store_key_file,
               "sign entries written, and require a valid MAC of entries read, with the store key in this file "
               "(default: $CHOREO_STORE_KEY_FILE; docs/store.md)");
}

void EngineFlags::resolve() {
  const std::optional<kv::TierConfig> c = kv::read_tier_config(kv::tier_config_path());
  if (!c) return;
  // A flag the command does not have takes the file's value.
  auto unset = [&](const char* flag) {
    const CLI::Option* option = app_ ? app_->get_option_no_throw(flag) : nullptr;
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

runtime::ModelOptions EngineFlags::model_options(const std::string& fallback_path) const {
  runtime::ModelOptions o;
  o.path = model_path.empty() ? fallback_path : model_path;
  o.backend = backend_choice().name;
  o.cuda_device = backend_choice().cuda_device;
  o.n_threads = n_threads;
  for (const std::string& f : lora_files) o.adapters.push_back({f, 1.0f});
  for (const runtime::AdapterFile& a : scaled_adapters(lora_scaled)) o.adapters.push_back(a);
  return o;
}

kernels::KvLayout EngineFlags::kv_layout(const model::Model& model) const {
  return model.kv_layout(page_tokens, kernels::parse_kv_type(type_k), kernels::parse_kv_type(type_v));
}

kv::TierSettings EngineFlags::tiers() const {
  kv::TierSettings t{size_t(host_cache_mib) << 20, kv::parse_eviction_policy(evict), size_t(disk_cache_mib) << 20};
  t.prefetch_steps = size_t(prefetch_steps);
  t.write_through = write_through;
  return t;
}

runtime::EngineOptions EngineFlags::engine_options(runtime::Mode mode, StorePolicy policy) const {
  runtime::EngineOptions o;
  o.mode = mode;
  o.page_tokens = page_tokens;
  o.k_type = kernels::parse_kv_type(type_k);
  o.v_type = kernels::parse_kv_type(type_v);
  o.t0_bytes = t0_bytes();
  o.tiers = tiers();
  if (!repair.empty()) o.repair = repair_from_flag(repair);
  runtime::StoreOptions& s = o.stores;
  s.key_file = store_key_file;
  if (!redis.empty()) {
    store::RedisAddress address = store::parse_redis_address(redis);
    if (const char* pw = std::getenv("CHOREO_REDIS_PASSWORD")) address.password = pw;
    s.redis = address;
    s.redis_best_effort = redis_best_effort;
  }
  const bool t2_writes = disk_cache_mib > 0;
  if (no_store || policy == StorePolicy::None) return o;
  const std::string dir = store::resolve_cache_dir(cache_dir);
  switch (policy) {
    case StorePolicy::None: break;
    case StorePolicy::Explicit:
      if (!cache_dir.empty() || t2_writes) s.disk_dir = dir;
      s.disk_create = t2_writes;
      break;
    case StorePolicy::Default:
      // Encodings saved by `choreo encode` (PML modules) are read from the store when it exists; with a T2
      // budget, evictions write to it too.
      if (!cache_dir.empty() || t2_writes || std::filesystem::is_directory(dir)) s.disk_dir = dir;
      s.disk_create = t2_writes;
      break;
    case StorePolicy::Writable:
      s.disk_dir = dir;
      s.disk_create = true;
      break;
  }
  return o;
}

nlohmann::ordered_json EngineFlags::tiers_json(const kv::TierStats& s) const {
  return {
      {"policy", evict},
      {"t0_budget_bytes", t0_bytes()},
      {"t1_budget_bytes", size_t(host_cache_mib) << 20},
      {"t0_peak_bytes", s.t0_peak_bytes},
      {"t1_peak_bytes", s.t1_peak_bytes},
      {"t0_evictions", s.t0_evictions},
      {"t1_offloads", s.t1_offloads},
      {"t1_offload_bytes", s.t1_offload_bytes},
      {"t1_hits", s.t1_hits},
      {"t1_load_bytes", s.t1_load_bytes},
      {"t1_load_tokens", s.t1_load_tokens},
      {"t1_evictions", s.t1_evictions},
      {"t2_budget_bytes", size_t(disk_cache_mib) << 20},
      {"t2_writes", s.t2.writes},
      {"t2_write_bytes", s.t2.write_bytes},
      {"t2_hits", s.t2.hits},
      {"t2_load_bytes", s.t2.load_bytes},
      {"t2_load_tokens", s.t2.load_tokens},
      {"t2_bad", s.t2.bad},
      {"t2_write_errors", s.t2.write_errors},
      {"t3_server", redis},
      {"t3_writes", s.t3.writes},
      {"t3_write_bytes", s.t3.stored_bytes},
      {"t3_hits", s.t3.hits},
      {"t3_load_tokens", s.t3.load_tokens},
      {"t3_bad", s.t3.bad},
      {"prefetch_steps", evict == "workflow" ? prefetch_steps : 0},
      {"write_through", write_through},
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
      {"e_t2_writes", s.t2.e_writes},
      {"e_t2_write_bytes", s.t2.e_write_bytes},
      {"e_t3_writes", s.t3.e_writes},
      {"e_t3_write_bytes", s.t3.e_write_bytes},
      {"e_t2_loads", s.t2.e_loads},
      {"e_t2_load_bytes", s.t2.e_load_bytes},
      {"e_t3_loads", s.t3.e_loads},
      {"e_t3_load_bytes", s.t3.e_load_bytes},
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
      s.t2.writes, s.t2.hits, s.t2.load_tokens,
      s.t2.bad + s.t2.write_errors ? fmt::format(", {} bad entries, {} failed writes", s.t2.bad, s.t2.write_errors)
                                   : "",
      s.recomputes, s.recomputed_tokens, s.load_ms,
      s.t3.writes + s.t3.hits ? fmt::format("; T3: {} writes, {} loads ({} tokens)", s.t3.writes, s.t3.hits,
                                            s.t3.load_tokens)
                              : "") +
         (s.prefetches ? fmt::format("; {} prefetches ({} used, {} wasted, {:.0f} ms waited)", s.prefetches,
                                     s.prefetch_used, s.prefetch_wasted, s.prefetch_wait_ms)
                       : "") +
         (s.e_saved + s.e_recomputed_tokens
              ? fmt::format("; E caches: {} saved ({:.1f} MiB), {} to T1 and {} back, {} to T2/T3 and {} back, {} "
                            "dropped, {} tokens recomputed ({:.0f} ms)",
                            s.e_saved, s.e_saved_bytes / 1048576.0, s.e_t1_offloads, s.e_t1_loads,
                            s.t2.e_writes + s.t3.e_writes, s.t2.e_loads + s.t3.e_loads, s.e_dropped,
                            s.e_recomputed_tokens, s.e_recompute_ms)
              : "");
}

void add_named_models(const std::vector<std::string>& lora_modules, const std::vector<std::string>& model_files,
                      const model::Model& base, runtime::ModelSet& set, runtime::ExtraModels& extra) {
  for (const auto& [name, file] : key_values(lora_modules, "--lora-modules"))
    set.add(name, base, model::LoraStack{{{model::LoraAdapter::load(file, base), 1.0f}}});
  for (const auto& [name, file] : key_values(model_files, "--model-file")) {
    extra.owned.push_back(model::Model::load(file, base.backend()));
    set.add(name, *extra.owned.back(), {});
  }
}

void add_named_model_flags(CLI::App& cmd, std::vector<std::string>& lora_modules,
                           std::vector<std::string>& model_files, const std::string& chosen_with) {
  add_pairs_option(cmd, "--lora-modules", lora_modules,
                   "NAME=ADAPTER.gguf: a model chosen with " + chosen_with +
                       " NAME, the model with that adapter (scale 1); repeatable");
  add_pairs_option(cmd, "--model-file", model_files,
                   "NAME=MODEL.gguf: another GGUF of the model's architecture, shapes and vocabulary, chosen with " +
                       chosen_with + " NAME; repeatable");
}

}  // namespace choreo::cli
