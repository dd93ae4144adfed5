// T3, Redis (issue 11): a real redis-server, started here on 127.0.0.1 with a password.
// - Two processes with different cache directories share one server: the second computes only what the first
//   did not (its prefills all come from Redis), and prints the same text.
// - `choreo encode --redis` puts a schema's modules in T3; a second encode with no store loads every piece.
// - A wrong password, or no server, is a clear error at start-up (exit 2); with --redis-best-effort, a
//   warning and a run without it.
// - A server that dies mid-run: a warning, recomputation, the same results.
// - A value corrupted in Redis is detected by its checksums and recomputed.

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <functional>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/store/redis_store.h"
#include "tests/cli_process.h"
#include "tests/runtime/bits.h"
#include "tests/runtime/page_edit.h"
#include "tests/runtime/redis_server.h"
#include "tests/runtime/workflow_cases.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

extern char** environ;

namespace choreo {
namespace {

using testing::kRedisPassword;
using testing::free_port;
using testing::RedisServer;
constexpr const char* kPassword = kRedisPassword;


std::vector<model::Token> text(const model::Model& m, const std::string& s) { return m.vocab().tokenize(s, false); }

nlohmann::json run_json(const std::string& path) { return nlohmann::json::parse(testing::read_file(path)); }

TEST_CASE("redis T3: two processes with different cache directories share encodings through one server") {
  RedisServer server;
  testing::ScratchDir scratch;
  const std::string workflow = ((testing::workflow_source_dir() / "workflows") / "madpar.yaml").string();
  auto run = [&](const std::string& name) {
    const std::string json = (scratch.path / (name + ".json")).string();
    const testing::ProcessResult r = testing::run_process(
        testing::choreo_binary(),
        {"run", workflow, "-m", testing::shared_file("models/stories260K.gguf"), "--input", "problem=What is 2+3?",
         "--param", "rounds=2", "--redis", server.address(), "--cache-dir", (scratch.path / name).string(),
         "--disk-cache-mib", "64", "--json", json},
        scratch.path, {.env = {std::string("CHOREO_REDIS_PASSWORD=") + kPassword}});
    INFO(r.err);
    REQUIRE(r.exited);
    REQUIRE(r.exit_code == 0);
    return std::make_pair(run_json(json), r.out);
  };
  const auto [first, first_out] = run("first");
  const auto [second, second_out] = run("second");
  CHECK(first_out == second_out);
  CHECK(first["tiers"]["t3_writes"].get<int>() > 0);
  int computed_first = 0, computed_second = 0, prefills = 0;
  for (const auto& m : first["messages"]) computed_first += m["n_computed"].get<int>();
  for (const auto& m : second["messages"]) {
    computed_second += m["n_computed"].get<int>();
    if (m["kind"] != "decode") {
      ++prefills;
      CHECK_MESSAGE(m["n_computed"].get<int>() == 0, m["name"]);  // every prefill came from Redis
    }
  }
  CHECK(prefills > 0);
  CHECK(second["tiers"]["t3_hits"].get<int>() > 0);
  CHECK(computed_second < computed_first);
  MESSAGE("tokens computed: first process " << computed_first << ", second " << computed_second);

  // `choreo cache stat` shows the tiers, T3 as the server reports it (the server from choreo.toml).
  const std::string config = (scratch.path / "choreo.toml").string();
  std::ofstream(config) << "[tiers]\nredis = \"" << server.address() << "\"\nhost_cache_mib = 512\n";
  const testing::ProcessResult stat = testing::run_process(
      testing::choreo_binary(), {"cache", "stat", "--cache-dir", (scratch.path / "first").string()}, scratch.path,
      {.env = {std::string("CHOREO_REDIS_PASSWORD=") + kPassword, "CHOREO_CONFIG=" + config}});
  INFO(stat.out, stat.err);
  CHECK(stat.exit_code == 0);
  CHECK(stat.out.find("T1 (host):   512 MiB") != std::string::npos);
  const std::string t3 = "T3 (Redis):  " + server.address() + ": " +
                         std::to_string(first["tiers"]["t3_writes"].get<int>()) + " encodings";
  CHECK(stat.out.find(t3) != std::string::npos);
}

TEST_CASE("redis T3: choreo encode writes a schema's modules to T3, and another process loads them all from it") {
  RedisServer server;
  testing::ScratchDir scratch;
  const std::string schema = (scratch.path / "tale.pml").string();
  std::ofstream(schema) << "<schema name=\"tale\">\n  Once upon a time there was a girl.\n  <union>\n"
                           "    <module name=\"cat\">She saw a cat in the garden.</module>\n"
                           "    <module name=\"dog\">She saw a dog by the river.</module>\n  </union>\n"
                           "  <module name=\"rain\">Then it started to rain.</module>\n</schema>\n";
  const std::string prompt = "<prompt schema=\"tale\"><dog/><rain/> The girl</prompt>";
  auto encode = [&] {
    const testing::ProcessResult r = testing::run_process(
        testing::choreo_binary(),
        {"encode", schema, "-m", testing::shared_file("models/stories260K.gguf"), "-t", "1", "--no-store", "--redis",
         server.address(), "-p", prompt, "-n", "12"},
        scratch.path, {.env = {std::string("CHOREO_REDIS_PASSWORD=") + kPassword}});
    INFO(r.err);
    REQUIRE(r.exited);
    REQUIRE(r.exit_code == 0);
    return r.out;
  };
  // "encoded: N tokens computed, ..." and "redis ADDR: W pieces written, L loaded (T tokens)".
  auto number_after = [](const std::string& out, const std::string& marker) {
    const size_t at = out.find(marker);
    REQUIRE_MESSAGE(at != std::string::npos, marker << " not in:\n" << out);
    return std::stoi(out.substr(at + marker.size()));
  };
  const std::string first = encode(), second = encode();
  const std::string redis_line = "redis " + server.address() + ": ";
  const int computed = number_after(first, "encoded: ");
  CHECK(computed > 0);
  const int written = number_after(first, redis_line);
  CHECK(written > 0);
  CHECK(number_after(second, "encoded: ") == 0);  // every piece came from T3
  CHECK(number_after(second, redis_line) == 0);
  CHECK(number_after(second, "pieces written, ") == written);
  CHECK(number_after(second, "loaded (") == computed);
  // The prompt served over the loaded modules generates what it did over the computed ones.
  auto generated = [&](const std::string& out) { return out.substr(out.find('\n', out.find(redis_line))); };
  CHECK(generated(first).size() > 1);
  CHECK(generated(first) == generated(second));
}

TEST_CASE("redis T3: a wrong password or no server is an error at start-up, and best effort warns and runs") {
  RedisServer server;
  testing::ScratchDir scratch;
  const std::vector<std::string> base = {"run", ((testing::workflow_source_dir() / "workflows") / "hello.yaml").string(), "-m",
                                         testing::shared_file("models/stories260K.gguf"), "--input",
                                         "question=Why?", "--no-store", "--redis"};
  auto run = [&](const std::string& address, const std::string& password, bool best_effort) {
    std::vector<std::string> args = base;
    args.push_back(address);
    if (best_effort) args.push_back("--redis-best-effort");
    return testing::run_process(testing::choreo_binary(), args, scratch.path,
                                {.env = {"CHOREO_REDIS_PASSWORD=" + password}});
  };
  const testing::ProcessResult wrong = run(server.address(), "not-the-password", false);
  CHECK(wrong.exit_code == 2);
  CHECK(wrong.err.find("password was refused") != std::string::npos);
  CHECK(wrong.err.find("CHOREO_REDIS_PASSWORD") != std::string::npos);
  const std::string nobody = "127.0.0.1:" + std::to_string(free_port());
  const testing::ProcessResult none = run(nobody, kPassword, false);
  CHECK(none.exit_code == 2);
  CHECK(none.err.find("cannot connect") != std::string::npos);
  const testing::ProcessResult best = run(nobody, kPassword, true);
  CHECK(best.exit_code == 0);
  CHECK(best.err.find("warning: Redis at " + nobody) != std::string::npos);
  const testing::ProcessResult bad = run("127.0.0.1:99999", kPassword, false);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("port must be a number") != std::string::npos);
}

/// Prefill A, decode over it, prefill B and decode over A and B; returns the decodes' logits.
std::vector<std::vector<std::vector<float>>> calls(runtime::Engine& e, std::function<void()> between = {}) {
  const model::Model& m = e.model();
  std::vector<std::vector<std::vector<float>>> out;
  const kv::MessageId a = e.prefill({text(m, "Once upon a time there was a little girl named Lily."), {}}).id;
  runtime::DecodeRequest r;
  r.header = text(m, " She");
  r.max_tokens = 8;
  r.record_logits = true;
  r.parents = {{a}};
  out.push_back(e.decode(r).logits);
  if (between) between();
  const kv::MessageId b = e.prefill({text(m, "She had a red ball and a big dog called Max."), {{a}}}).id;
  r.parents = {{a}, {b}};
  out.push_back(e.decode(r).logits);
  return out;
}

TEST_CASE("redis T3: a server that dies mid-run is a warning, and the run recomputes and gives the same results") {
  const model::Model& m = *testing::stories260k().model;
  std::vector<std::vector<std::vector<float>>> want;
  {
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
    runtime::Engine e(m, pool);
    want = calls(e);
  }
  RedisServer server;
  std::vector<std::string> warnings;
  store::RedisStore redis({"127.0.0.1", server.port(), kPassword},
                          [&](const std::string& w) { warnings.push_back(w); });
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine e(m, pool);
  e.set_remote_store(&redis);
  const auto got = calls(e, [&] { server.kill(); });
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(testing::bit_identical(want[i], got[i]));
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("stopped answering") != std::string::npos);
  CHECK_FALSE(redis.usable());
  CHECK(e.tier_stats().t3.writes >= 1);
}

/// Steps to execution written down per message.
struct StepsOf final : runtime::StepOracle {
  std::map<kv::MessageId, size_t> steps;
  std::optional<size_t> steps_to_execution(kv::MessageId id) const override {
    auto it = steps.find(id);
    return it == steps.end() ? std::nullopt : std::optional<size_t>(it->second);
  }
};

TEST_CASE("redis T3: an evicted message due soon is prefetched from T3 on a connection of its own, same bits") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  const runtime::PrefillRequest first{
      text(m, "Once upon a time there was a little girl named Lily who loved the sea and the sun."), {}};
  runtime::DecodeRequest r;
  r.header = text(m, " She");
  r.max_tokens = 8;
  r.record_logits = true;
  std::vector<std::vector<float>> want;
  {
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
    runtime::Engine e(m, pool);
    r.parents = {{e.prefill(first).id}};
    want = e.decode(r).logits;
  }
  RedisServer server;
  store::RedisStore redis({"127.0.0.1", server.port(), kPassword});
  kv::PagePool pool(m.backend(), m.kv_layout(16), 8 * page);
  runtime::Engine e(m, pool);
  e.set_remote_store(&redis);
  kv::TierSettings tiers{0, kv::EvictionPolicy::Workflow, 0};  // nothing below T0 but T3
  tiers.prefetch_steps = 2;
  e.set_tiers(tiers);
  StepsOf oracle;
  e.step_oracles().add(&oracle);
  const kv::MessageId a = e.prefill(first).id;  // written through to T3
  auto filler = [&](int i) {
    return e.prefill({text(m, fmt::format("Story {}: a dog ran to the park and played with a ball all day.", i)), {}});
  };
  for (int i = 0; e.store().get(a).resident(); ++i) {
    REQUIRE(i < 20);
    filler(i);
  }
  oracle.steps[a] = 1;
  filler(100);  // its batch starts the prefetch
  r.parents = {{a}};
  const runtime::DecodeResult d = e.decode(r);
  e.step_oracles().remove(&oracle);
  CHECK(testing::bit_identical(want, d.logits));
  const kv::TierStats s = e.tier_stats();
  CHECK(s.prefetches == 1);
  CHECK(s.prefetch_used == 1);
  CHECK(s.t3.hits == 1);
  CHECK(s.recomputes == 0);
  CHECK(d.stats.n_loaded == int(first.tokens.size()));
}

TEST_CASE("redis T3: a value corrupted in Redis is detected by its checksums and recomputed") {
  const model::Model& m = *testing::stories260k().model;
  RedisServer server;
  std::vector<std::string> warnings;
  store::RedisStore redis({"127.0.0.1", server.port(), kPassword},
                          [&](const std::string& w) { warnings.push_back(w); });
  const std::vector<model::Token> tokens = text(m, "Once upon a time there was a little girl named Lily.");
  uint64_t key = 0;
  std::vector<float> want;
  {
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
    runtime::Engine e(m, pool);
    e.set_remote_store(&redis);
    const kv::Message& a = e.store().get(e.prefill({tokens, {}}).id);
    key = a.key;
    want = testing::page_floats(a.pages, 1);
  }
  std::optional<std::vector<uint8_t>> value = redis.get(key);
  REQUIRE(value);
  (*value)[value->size() - 8] ^= 0x5a;  // a byte of the last page
  REQUIRE(redis.put(key, *value));
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine e(m, pool);
  e.set_remote_store(&redis);
  const runtime::PrefillResult r = e.prefill({tokens, {}});
  CHECK(r.stats.n_computed == int(tokens.size()));
  CHECK(e.tier_stats().t3.bad == 1);
  const kv::Message& a = e.store().get(r.id);
  CHECK(testing::bit_identical(want, testing::page_floats(a.pages, 1)));
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("checksum") != std::string::npos);
}

}  // namespace
}  // namespace choreo
