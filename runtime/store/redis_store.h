#pragma once
// T3 of the KV tiers (docs/store.md, "Tiers"): encodings in a Redis server, shared between processes and
// machines. A value is a whole store entry (runtime/store/entry_format.h: header, checksums, pages) under
// `choreo:kv:<content key>`; content keys already cover the model, so one server can serve several models.
// Every value read is parsed and checked like a file of the disk store before any page is used; with a store
// key (entry_auth.h) values are signed like disk entries, and an unsigned or forged value is not used.
//
// Talks to the server through hiredis. Every command has a deadline for its whole reply (a server that
// trickles its answer cannot hold a run), and a reply announcing a value larger than the largest entry the
// run could use is refused before it is read. A server that fails either way, or stops answering, makes this
// object unusable: it warns once and every later call misses, so the engine recomputes instead.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/store/entry_auth.h"
#include "runtime/store/entry_store.h"

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

/// How a RedisStore talks to its server.
struct RedisLimits {
  /// Connecting, and each command with a small reply, must be done within this.
  std::chrono::milliseconds timeout{2000};
  /// Values larger than this are neither read nor written (the largest entry a run can use: its KV budget).
  uint64_t max_value_bytes = uint64_t(1) << 30;
  /// A command moving a value gets this much more time per byte: timeout + bytes / bytes_per_second.
  uint64_t bytes_per_second = uint64_t(32) << 20;
};

class RedisStore final : public EntryStore {
 public:
  /// Connects and authenticates, and checks the server answers. Throws InputError naming the address when
  /// it cannot connect, the password is refused or the server does not answer within the limits' timeout.
  /// `auth`, when set, signs every value written and is required of every value read.
  RedisStore(const RedisAddress& address, WarningSink warn = {}, RedisLimits limits = {},
             std::optional<EntryAuthenticator> auth = configured_authenticator());
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  /// The server and password, e.g. for another connection (a connection serves one thread at a time).
  const RedisAddress& address() const { return address_; }
  const RedisLimits& limits() const { return limits_; }

  /// Stores bytes under a content key as they are (no signing: save() makes entries). False when the server
  /// is unusable or refuses them.
  bool put(uint64_t content_key, std::span<const uint8_t> value);
  /// The bytes stored under a key as they are (not checked: open() checks), or nullopt (absent, or the
  /// server unusable).
  std::optional<std::vector<uint8_t>> get(uint64_t content_key);
  /// How many of choreo's encodings the server holds and their bytes (a SCAN over `choreo:kv:*`); nullopt
  /// when the server is unusable.
  std::optional<std::pair<size_t, uint64_t>> usage();
  /// Entries written and read by this object.
  size_t puts() const { return puts_; }
  size_t hits() const { return hits_; }

  // ---- EntryStore ----
  int tier() const override { return 3; }
  std::string where() const override;
  bool usable() const override { return context_ != nullptr; }
  bool keyed() const override { return auth_.has_value(); }
  /// The value under `key`, parsed, checked and (when keyed) authenticated; a bad one is reported once.
  Opened open(uint64_t key, const Compatibility& expect) override;
  /// The value is read in finish(), on a connection of that thread's own.
  std::unique_ptr<PendingEntry> begin_open(uint64_t key, const Compatibility& expect, bool* bad) override;
  /// True when the server has a value under the key (EXISTS).
  bool holds(uint64_t key) const override;
  /// The value's size.
  std::optional<uint64_t> save(const EntryMeta& meta, std::span<const std::byte* const> pages,
                               std::span<const std::span<const uint8_t>> e_sections = {}) override;
  /// Reports an entry that failed its checks (once per key).
  void report_bad(uint64_t content_key, std::string_view what) override;

 private:
  struct Reply;
  // Sends one command and reads its whole reply within the deadline (timeout + payload / bytes_per_second,
  // the payload being what the command sends or the value the reply announces); a bulk reply announced
  // longer than max_value_bytes is refused unread. Null (after fail()) when anything went wrong.
  std::unique_ptr<Reply> command(std::span<const std::string_view> args) const;
  void fail(const std::string& what) const;  // warns once, then drops the connection
  std::string key_name(uint64_t content_key) const;

  RedisAddress address_;
  WarningSink warn_;
  RedisLimits limits_;
  std::optional<EntryAuthenticator> auth_;
  mutable redisContext* context_ = nullptr;
  size_t puts_ = 0, hits_ = 0;
  std::vector<uint64_t> reported_;
};

}  // namespace choreo::store
