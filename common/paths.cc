#include "common/paths.h"

#include <cstdlib>

namespace choreo {

std::string cache_root() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/choreo";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/choreo";
}

std::string default_model_path() {
  if (const char* env = std::getenv("CHOREO_MODEL"); env && *env) return env;
  return cache_root() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace choreo
