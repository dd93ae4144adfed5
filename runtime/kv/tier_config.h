#pragma once
// The KV tiers' settings from a file (docs/store.md, "Tiers"): `[tiers]` of choreo.toml in the XDG config
// directory. Command-line flags win over it.
//
//   [tiers]
//   cache_mib = 2048          # T0
//   host_cache_mib = 8192     # T1
//   disk_cache_mib = 0        # T2 writes
//   evict = "workflow"        # or "lru"
//   redis = "127.0.0.1:6379"  # T3 (the password stays in $CHOREO_REDIS_PASSWORD)
//   redis_best_effort = false
//   prefetch_steps = 2        # with evict = "workflow"; 0: off
//   write_through = false     # T2 written when a message is made, not when it is evicted

#include <cstdint>
#include <optional>
#include <string>

namespace choreo::kv {

/// What a choreo.toml sets (each key optional).
struct TierConfig {
  std::string path;
  std::optional<int64_t> cache_mib, host_cache_mib, disk_cache_mib, prefetch_steps;
  std::optional<std::string> evict, redis;
  std::optional<bool> redis_best_effort, write_through;
};

/// $CHOREO_CONFIG when set, else $XDG_CONFIG_HOME/choreo/choreo.toml, else ~/.config/choreo/choreo.toml.
std::string tier_config_path();

/// The `[tiers]` table of the file at `path`; nullopt when there is no such file. Malformed TOML, an unknown
/// key (with a did-you-mean), a value of the wrong type or out of range is an InputError at file:line:col.
std::optional<TierConfig> read_tier_config(const std::string& path);

}  // namespace choreo::kv
