// choreo.toml's [tiers] (runtime/kv/tier_config.h): what it sets, the errors it gives at file:line:col, and
// that command-line flags win over it (through the real binary).

#include <doctest/doctest.h>

#include <fstream>

#include "common/error.h"
#include "runtime/kv/tier_config.h"
#include "tests/cli_process.h"
#include "tests/runtime/workflow_cases.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

std::string write(const testing::ScratchDir& dir, const std::string& text) {
  const std::string path = (dir.path / "choreo.toml").string();
  std::ofstream(path) << text;
  return path;
}

InputError error_of(const std::string& path) {
  try {
    kv::read_tier_config(path);
  } catch (const InputError& e) {
    return e;
  }
  FAIL("expected an InputError");
  return InputError("unreachable");
}

TEST_CASE(
    "tier config: the tiers table sets budgets, policy and Redis, and bad values are errors at "
    "file:line:col") {
  testing::ScratchDir dir;
  CHECK_FALSE(kv::read_tier_config((dir.path / "none.toml").string()));
  const std::optional<kv::TierConfig> c = kv::read_tier_config(write(
      dir, "# mine\n[tiers]\ncache_mib = 2048\nhost_cache_mib = 8192\nevict = \"lru\"\nredis = \"10.0.0.2:6380\"\n"
           "redis_best_effort = true\n"));
  REQUIRE(c);
  CHECK(c->cache_mib == 2048);
  CHECK(c->host_cache_mib == 8192);
  CHECK_FALSE(c->disk_cache_mib);
  CHECK(c->evict == "lru");
  CHECK(c->redis == "10.0.0.2:6380");
  CHECK(c->redis_best_effort == true);

  InputError e = error_of(write(dir, "[tiers]\ncache_mb = 5\n"));
  CHECK(e.message().find("unknown key `cache_mb`") != std::string::npos);
  CHECK(e.hint().find("did you mean 'cache_mib'?") != std::string::npos);
  CHECK(e.where().line == 2);
  CHECK(e.where().col == 1);
  e = error_of(write(dir, "[tiers]\nhost_cache_mib = \"lots\"\n"));
  CHECK(e.message().find("`host_cache_mib` must be a whole number of MiB") != std::string::npos);
  CHECK(e.where().line == 2);
  CHECK(e.where().col == 18);
  e = error_of(write(dir, "[tiers]\ncache_mib = 0\n"));
  CHECK(e.message().find("from 1 to") != std::string::npos);
  e = error_of(write(dir, "[tiers]\nevict = \"fifo\"\n"));
  CHECK(e.message().find("`evict` must be \"workflow\" or \"lru\"") != std::string::npos);
  e = error_of(write(dir, "[tiers\ncache_mib = 1\n"));
  CHECK(e.message().find("is not valid TOML") != std::string::npos);
  CHECK(e.where().line == 1);
  e = error_of(write(dir, "tiers = 3\n"));
  CHECK(e.message().find("`tiers` must be a table") != std::string::npos);

  const std::optional<kv::TierConfig> p =
      kv::read_tier_config(write(dir, "[tiers]\nprefetch_steps = 3\nwrite_through = true\n"));
  REQUIRE(p);
  CHECK(p->prefetch_steps == 3);
  CHECK(p->write_through == true);
  e = error_of(write(dir, "[tiers]\nprefetch_steps = -1\n"));
  CHECK(e.message().find("`prefetch_steps` must be a whole number of steps") != std::string::npos);
  CHECK(e.where().line == 2);
  e = error_of(write(dir, "[tiers]\nwrite_through = 1\n"));
  CHECK(e.message().find("`write_through` must be true or false") != std::string::npos);
  e = error_of(write(dir, "[tiers]\nprefetch_step = 2\n"));
  CHECK(e.hint().find("did you mean 'prefetch_steps'?") != std::string::npos);
}

TEST_CASE("tier config: choreo run takes its budgets from choreo.toml, and a flag wins over the file") {
  testing::ScratchDir dir;
  const std::string config = write(dir, "[tiers]\ncache_mib = 1\n");
  const std::vector<std::string> base = {"run", (testing::workflow_source_dir() / "workflows" / "madpar.yaml").string(),
                                         "-m", testing::shared_file("models/stories260K.gguf"), "--input",
                                         "problem=What is 2+3?", "--no-store"};
  const testing::ProcessOptions env{.env = {"CHOREO_CONFIG=" + config}};
  const testing::ProcessResult from_file = testing::run_process(testing::choreo_binary(), base, dir.path, env);
  CHECK(from_file.exit_code == 2);
  CHECK(from_file.err.find("KV cache budget (T0) of 1.0 MiB") != std::string::npos);
  std::vector<std::string> with_flag = base;
  with_flag.insert(with_flag.end(), {"--cache-mib", "64"});
  const testing::ProcessResult flag = testing::run_process(testing::choreo_binary(), with_flag, dir.path, env);
  CHECK_MESSAGE(flag.exit_code == 0, flag.err);
  const testing::ProcessOptions bad{.env = {"CHOREO_CONFIG=" + write(dir, "[tiers]\nevict = 3\n")}};
  const testing::ProcessResult broken = testing::run_process(testing::choreo_binary(), with_flag, dir.path, bad);
  CHECK(broken.exit_code == 2);
  CHECK(broken.err.find("choreo.toml:2:") != std::string::npos);
}

}  // namespace
}  // namespace choreo
