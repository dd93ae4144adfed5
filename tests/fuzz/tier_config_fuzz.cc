// libFuzzer target for choreo.toml (runtime/kv/tier_config): any bytes must read as a [tiers] table whose
// values are in range, or throw an InputError naming the file at a line inside it; never crash, hang, leak or
// throw anything else. The bytes go through a file in /dev/shm (else the temp dir), as the reader takes a path.
// With CHOREO_FUZZ_SEED_DIR set, start-up writes a seed there (scripts/fuzz.sh).

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "runtime/kv/tier_config.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

const std::string& scratch_path() {
  static const std::string path = [] {
    const std::filesystem::path dir =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    if (const char* seeds = std::getenv("CHOREO_FUZZ_SEED_DIR"))
      std::ofstream(std::filesystem::path(seeds) / "seed_tiers")
          << "[tiers]\ncache_mib = 2048\nhost_cache_mib = 0\ndisk_cache_mib = 64\nevict = \"lru\"\n"
             "redis = \"127.0.0.1:6379\"\nredis_best_effort = true\n";
    return (dir / ("choreo-fuzz-tiers-" + std::to_string(getpid()) + ".toml")).string();
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  const std::string text =
      choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 256 << 10);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  const int lines = choreo::fuzz::line_count(text);
  try {
    const std::optional<choreo::kv::TierConfig> c = choreo::kv::read_tier_config(path);
    if (!c) __builtin_trap();  // the file exists
    if (c->cache_mib && *c->cache_mib < 1) __builtin_trap();
    if (c->host_cache_mib && *c->host_cache_mib < 0) __builtin_trap();
    if (c->evict && *c->evict != "lru" && *c->evict != "workflow") __builtin_trap();
  } catch (const choreo::InputError& e) {
    const choreo::SourceLocation& where = e.where();
    if (where.file != path || where.line < 0 || where.line > lines + 1 || where.col < 0) __builtin_trap();
    volatile size_t sink = e.render().size();
    (void)sink;
  }
  return 0;
}
