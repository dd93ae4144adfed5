#include "runtime/kv/tier_config.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include <toml++/toml.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/suggest.h"

namespace choreo::kv {

namespace {

constexpr std::array<std::string_view, 8> kKeys = {"cache_mib", "host_cache_mib",    "disk_cache_mib", "evict",
                                                   "redis",     "redis_best_effort", "prefetch_steps", "write_through"};

SourceLocation where(const std::string& path, const toml::source_region& r) {
  return {path, int(r.begin.line), int(r.begin.column)};
}

}  // namespace

std::string tier_config_path() {
  if (const char* p = std::getenv("CHOREO_CONFIG"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return std::string(x) + "/choreo/choreo.toml";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.config/choreo/choreo.toml";
}

std::optional<TierConfig> read_tier_config(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  const std::string text = read_input_file(path, "config file", 1 << 20);
  toml::table doc;
  try {
    doc = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{} is not valid TOML: {}", path, e.description()), "see docs/store.md, \"Tiers\"",
                     where(path, e.source()));
  }
  TierConfig c;
  c.path = path;
  const toml::node* tiers_node = doc.get("tiers");
  if (!tiers_node) return c;
  const toml::table* tiers = tiers_node->as_table();
  if (!tiers)
    throw InputError("`tiers` must be a table", "write it as a [tiers] section", where(path, tiers_node->source()));
  for (const auto& [key, value] : *tiers) {
    const std::string_view k = key.str();
    const SourceLocation at = where(path, value.source());
    if (std::find(kKeys.begin(), kKeys.end(), k) == kKeys.end())
      throw InputError(fmt::format("unknown key `{}` in [tiers]", k), did_you_mean(k, kKeys),
                       where(path, key.source()));
    if (k == "evict" || k == "redis") {
      const std::optional<std::string> s = value.value<std::string>();
      if (!s) throw InputError(fmt::format("`{}` must be a string", k), "", at);
      if (k == "evict") {
        if (*s != "lru" && *s != "workflow")
          throw InputError(fmt::format("`evict` must be \"workflow\" or \"lru\", got \"{}\"", *s), "", at);
        c.evict = *s;
      } else {
        c.redis = *s;
      }
    } else if (k == "redis_best_effort" || k == "write_through") {
      const std::optional<bool> b = value.value_exact<bool>();
      if (!b) throw InputError(fmt::format("`{}` must be true or false", k), "", at);
      (k == "write_through" ? c.write_through : c.redis_best_effort) = *b;
    } else if (k == "prefetch_steps") {
      const std::optional<int64_t> n = value.value_exact<int64_t>();
      if (!n || *n < 0 || *n > 1000)
        throw InputError("`prefetch_steps` must be a whole number of steps from 0 to 1000", "0 turns prefetch off", at);
      c.prefetch_steps = *n;
    } else {
      const std::optional<int64_t> n = value.value_exact<int64_t>();
      const int64_t low = k == "cache_mib" ? 1 : 0;
      if (!n || *n < low || *n > (int64_t(1) << 30))
        throw InputError(fmt::format("`{}` must be a whole number of MiB from {} to {}", k, low, int64_t(1) << 30), "", at);
      (k == "cache_mib" ? c.cache_mib : k == "host_cache_mib" ? c.host_cache_mib : c.disk_cache_mib) = *n;
    }
  }
  return c;
}

}  // namespace choreo::kv
