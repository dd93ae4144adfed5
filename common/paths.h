#pragma once
// Where choreo keeps things on disk by default.

#include <string>

namespace choreo {

/// $XDG_CACHE_HOME/choreo, else ~/.cache/choreo.
std::string cache_root();
/// The default model: $CHOREO_MODEL, else <cache_root>/models/SmolLM2-135M-Instruct.Q4_1.gguf
/// (where scripts/setup.sh puts it).
std::string default_model_path();

}  // namespace choreo
