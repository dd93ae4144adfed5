// T3 against a hostile server or writer (issue 42, findings 1-3):
// - values are signed with the store key like disk entries: a value forged by someone who can write the
//   server (pages edited, every checksum recomputed) is refused by a keyed reader and recomputed, as are an
//   unsigned value and one signed with another key; an unkeyed reader would take the forgery (the limit the
//   key removes);
// - a reply trickled one byte at a time ends at the command's deadline, not after it arrives (never, for an
//   endless one): a warning, then the run goes on without T3 and computes what it would have read;
// - a reply announcing a value of several gigabytes is refused before it is read.
// Each run still gives the bits a fresh computation gives.

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/store/entry_store.h"
#include "runtime/store/redis_store.h"
#include "tests/runtime/bits.h"
#include "tests/runtime/fake_redis.h"
#include "tests/runtime/page_edit.h"
#include "tests/runtime/redis_server.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using testing::FakeRedis;
using testing::RedisServer;

std::vector<model::Token> tokens_of(const model::Model& m) {
  return m.vocab().tokenize("Once upon a time there was a little girl named Lily. She loved the park.", false);
}

store::EntryAuthenticator key(uint8_t fill) {
  const std::vector<uint8_t> secret(32, fill);
  return store::EntryAuthenticator::from_secret(secret, "test key");
}

/// One prefill of tokens_of(m) on an engine whose T3 is `redis`: its pages and whether it was loaded.
struct Prefilled {
  std::vector<float> pages;
  bool loaded = false;
  kv::TierStats stats;
};
Prefilled prefill_over(store::RedisStore& redis) {
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine e(m, pool);
  e.set_remote_store(&redis);
  const runtime::PrefillResult r = e.prefill({tokens_of(m), {}});
  return {testing::page_floats(e.store().get(r.id).pages), r.loaded, e.tier_stats()};
}

/// `value` (a stored entry) with one byte of its first page changed and every checksum recomputed, signed
/// with `auth` or unsigned: what a writer to the server can make.
std::vector<uint8_t> forged(const std::vector<uint8_t>& value, const store::EntryAuthenticator* auth) {
  const store::ParsedEntry parsed = store::parse_entry(value);
  REQUIRE(parsed.problem == store::EntryProblem::Ok);
  std::vector<std::vector<uint8_t>> pages;
  for (size_t i = 0; i < parsed.meta.n_pages(); ++i) {
    const auto* page = reinterpret_cast<const uint8_t*>(store::entry_page(value, parsed, i));
    pages.emplace_back(page, page + parsed.meta.page_bytes());
  }
  pages[0][5] ^= 0x40;  // a byte of a key of the first token
  std::vector<std::span<const uint8_t>> body(pages.begin(), pages.end());
  return store::encode_entry(parsed.meta, body, auth);
}

TEST_CASE("redis T3: a keyed reader refuses a value forged without the key, an unsigned one and another key's, and recomputes the same bits") {
  RedisServer server;
  const store::RedisAddress address{"127.0.0.1", server.port(), testing::kRedisPassword};
  const store::EntryAuthenticator ours = key(7), theirs = key(9);
  store::RedisStore writer(address, {}, {}, ours);
  const Prefilled fresh = prefill_over(writer);  // computes and writes the signed value
  CHECK(!fresh.loaded);
  CHECK(fresh.stats.t3.writes == 1);
  const model::Model& m = *testing::stories260k().model;
  const uint64_t content_key = [&] {
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
    runtime::Engine e(m, pool);
    return e.store().get(e.prefill({tokens_of(m), {}}).id).key;
  }();
  const std::optional<std::vector<uint8_t>> signed_value = writer.get(content_key);
  REQUIRE(signed_value);

  {  // Control: the signed value is used.
    store::RedisStore reader(address, {}, {}, ours);
    const Prefilled r = prefill_over(reader);
    CHECK(r.loaded);
    CHECK(testing::bit_identical(fresh.pages, r.pages));
  }
  for (const char* how : {"unsigned", "signed with another key"}) {
    CAPTURE(how);
    const std::vector<uint8_t> value = forged(*signed_value, std::string(how) == "unsigned" ? nullptr : &theirs);
    REQUIRE(writer.put(content_key, value));
    std::vector<std::string> warnings;
    store::RedisStore reader(address, [&](const std::string& w) { warnings.push_back(w); }, {}, ours);
    const Prefilled r = prefill_over(reader);
    CHECK(!r.loaded);
    CHECK(r.stats.t3.bad == 1);
    CHECK(testing::bit_identical(fresh.pages, r.pages));
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0].find(std::string(how) == "unsigned" ? "no MAC" : "MAC") != std::string::npos);
  }
  // Not vacuous: the forgery passes every unkeyed check, and a reader without the key takes its pages.
  REQUIRE(writer.put(content_key, forged(*signed_value, nullptr)));
  store::RedisStore unkeyed(address, {}, {}, std::nullopt);
  const Prefilled taken = prefill_over(unkeyed);
  CHECK(taken.loaded);
  CHECK(!testing::bit_identical(fresh.pages, taken.pages));
}

/// Runs `f` on a thread and waits at most `limit` for it: false when it is still running (a hang).
template <typename F>
bool finishes_within(std::chrono::seconds limit, F f) {
  auto done = std::async(std::launch::async, std::move(f));
  return done.wait_for(limit) == std::future_status::ready;
}

TEST_CASE("redis T3: a reply trickled one byte at a time ends at the command's deadline and the run computes instead") {
  // A bulk reply of 100000 bytes, one byte every 100 ms (it would take hours; the server gives up after 30 s):
  // each read gets a byte well within any per-read timeout.
  FakeRedis fake([](int fd, const std::function<bool()>& stopping) {
    if (!FakeRedis::send_all(fd, "$100000\r\n")) return;
    for (int i = 0; i < 300 && !stopping(); ++i) {
      if (!FakeRedis::send_all(fd, "x")) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<std::string> warnings;
  store::RedisLimits limits;
  limits.timeout = std::chrono::milliseconds(500);
  store::RedisStore redis({"127.0.0.1", fake.port(), ""}, [&](const std::string& w) { warnings.push_back(w); },
                          limits, std::nullopt);
  Prefilled r;
  CHECK(finishes_within(std::chrono::seconds(15), [&] { r = prefill_over(redis); }));  // not 30 s: not the trickle's end
  CHECK(!r.loaded);
  CHECK(!redis.usable());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("no whole reply within") != std::string::npos);
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine plain(m, pool);
  CHECK(testing::bit_identical(testing::page_floats(plain.store().get(plain.prefill({tokens_of(m), {}}).id).pages),
                               r.pages));
}

TEST_CASE("redis T3: a reply announcing a multi-GB value is refused before it is read") {
  // The announcement, then 256 MiB as fast as the connection takes them (a reader that buffers the value
  // holds them all, and waits for the rest), then nothing.
  FakeRedis fake([](int fd, const std::function<bool()>& stopping) {
    if (!FakeRedis::send_all(fd, "$4000000000\r\n")) return;
    const std::string chunk(1 << 16, 'x');
    for (int i = 0; i < 4096 && !stopping(); ++i)
      if (!FakeRedis::send_all(fd, chunk)) return;
    while (!stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  std::vector<std::string> warnings;
  store::RedisLimits limits;
  limits.max_value_bytes = uint64_t(1) << 20;
  store::RedisStore redis({"127.0.0.1", fake.port(), ""}, [&](const std::string& w) { warnings.push_back(w); },
                          limits, std::nullopt);
  Prefilled r;
  CHECK(finishes_within(std::chrono::seconds(60), [&] { r = prefill_over(redis); }));
  CHECK(!r.loaded);
  CHECK(!redis.usable());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("announced a value of 4000000000 bytes") != std::string::npos);
}

}  // namespace
}  // namespace choreo
