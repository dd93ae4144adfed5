#pragma once
// Where the persistent encoding store lives (docs/store.md).

#include <string>
#include <string_view>

namespace choreo::store {

/// The store directory: `flag_value` when non-empty (--cache-dir), else $CHOREO_CACHE_DIR, else
/// $XDG_CACHE_HOME/choreo/store, else ~/.cache/choreo/store.
std::string resolve_cache_dir(std::string_view flag_value);

}  // namespace choreo::store
