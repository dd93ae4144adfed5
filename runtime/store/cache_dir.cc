#include "runtime/store/cache_dir.h"

#include <cstdlib>

#include "common/paths.h"

namespace choreo::store {

std::string resolve_cache_dir(std::string_view flag_value) {
  if (!flag_value.empty()) return std::string(flag_value);
  if (const char* env = std::getenv("CHOREO_CACHE_DIR"); env && *env) return env;
  return cache_root() + "/store";  // cache_root() applies $XDG_CACHE_HOME, else ~/.cache
}

}  // namespace choreo::store
