#pragma once
// T3 of the KV tiers (docs/store.md, "Tiers"): encodings in a Redis server, shared between processes and
// machines. A value is a whole store entry (runtime/store/entry_format.h: header, checksums, pages) under
// `choreo:kv:<content key>`; content keys already cover the model, so one server can serve several models.
// Every value read is parsed and checked like a file of the disk store before any page is used.
//
// Talks to the server through hiredis, synchronously, with a timeout on every command. A server that stops
// answering mid-run makes this object unusable: it warns once and every later call misses, so the engine
// recomputes instead.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/store/disk_store.h"

struct redisContext;

namespace choreo::store {

/// Where the server is: `host:port`, and the password (the `requirepass` of the server; empty: none).
struct RedisAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password;
};

/// Parses `host:port` (or just `host`, port 6379); throws InputError otherwise.
RedisAddress parse_redis_address(std::string_view text);

class RedisStore {
 public:
  /// Connects and authenticates, and checks the server answers. Throws InputError naming the address when
  /// it cannot connect, the password is refused or the server does not answer within `timeout`.
  RedisStore(const RedisAddress& address, WarningSink warn = {},
             std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));
  ~RedisStore();
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  /// False once the server stopped answering (after the one warning).
  bool usable() const { return context_ != nullptr; }
  /// The server and password, e.g. for another connection (a connection serves one thread at a time).
  const RedisAddress& address() const { return address_; }
  std::string where() const;

  /// Stores one entry's bytes under its key. False when the server is unusable.
  bool put(uint64_t content_key, std::span<const uint8_t> entry);
  /// The bytes stored under a key, or nullopt (absent, or the server unusable).
  std::optional<std::vector<uint8_t>> get(uint64_t content_key);
  /// How many of choreo's encodings the server holds and their bytes (a SCAN over `choreo:kv:*`); nullopt
  /// when the server is unusable.
  std::optional<std::pair<size_t, uint64_t>> usage();
  /// Entries written and read by this object.
  size_t puts() const { return puts_; }
  size_t hits() const { return hits_; }

  /// Reports an entry that failed its checks (once per key).
  void report_bad(uint64_t content_key, std::string_view what);

 private:
  void fail(const std::string& what);  // warns once, then drops the connection
  std::string key_name(uint64_t content_key) const;

  RedisAddress address_;
  WarningSink warn_;
  redisContext* context_ = nullptr;
  size_t puts_ = 0, hits_ = 0;
  std::vector<uint64_t> reported_;
};

}  // namespace choreo::store
