#include "runtime/store/redis_store.h"

#include <poll.h>

#include <algorithm>
#include <charconv>
#include <cstdio>

#include <hiredis/hiredis.h>

#include "common/error.h"
#include "runtime/store/disk_store.h"  // key_hex

namespace choreo::store {

/// One reply, freed when it goes.
struct RedisStore::Reply {
  redisReply* r = nullptr;
  explicit Reply(redisReply* p) : r(p) {}
  ~Reply() {
    if (r) freeReplyObject(r);
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
};

namespace {

using SteadyClock = std::chrono::steady_clock;

timeval to_timeval(std::chrono::milliseconds t) {
  return {long(t.count() / 1000), long((t.count() % 1000) * 1000)};
}

/// How long moving `bytes` may take on top of the command's timeout.
SteadyClock::duration transfer_time(uint64_t bytes, const RedisLimits& limits) {
  const double seconds = double(bytes) / double(std::max<uint64_t>(limits.bytes_per_second, 1));
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

/// Waits until `fd` is ready for `events` or the deadline passes; false on the deadline or an error.
bool wait_for(int fd, short events, SteadyClock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 60000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

/// The length a bulk reply at the start of `pending` announces ("$<n>\r\n"): nullopt while the line is not
/// complete; -1 for a reply of another kind (or a nil).
std::optional<int64_t> announced_length(std::string_view pending) {
  if (pending.empty()) return std::nullopt;
  if (pending[0] != '$') return -1;
  const size_t end = pending.find("\r\n");
  if (end == std::string_view::npos) return pending.size() > 32 ? std::optional<int64_t>(-2) : std::nullopt;
  int64_t n = 0;
  const auto [ptr, ec] = std::from_chars(pending.data() + 1, pending.data() + end, n);
  if (ec != std::errc() || ptr != pending.data() + end) return -2;
  return n;
}

}  // namespace

RedisAddress parse_redis_address(std::string_view text) {
  RedisAddress a;
  const size_t colon = text.rfind(':');
  a.host = std::string(text.substr(0, colon));
  if (colon != std::string_view::npos) {
    const std::string_view port = text.substr(colon + 1);
    int value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 65535)
      throw InputError(fmt::format("bad Redis address '{}': the port must be a number from 1 to 65535", text),
                       "write host:port, e.g. 127.0.0.1:6379");
    a.port = value;
  }
  if (a.host.empty())
    throw InputError(fmt::format("bad Redis address '{}': no host", text), "write host:port, e.g. 127.0.0.1:6379");
  return a;
}

RedisStore::RedisStore(const RedisAddress& address, WarningSink warn, RedisLimits limits,
                       std::optional<EntryAuthenticator> auth)
    : address_(address), warn_(std::move(warn)), limits_(limits), auth_(std::move(auth)) {
  const timeval tv = to_timeval(limits_.timeout);
  context_ = redisConnectWithTimeout(address_.host.c_str(), address_.port, tv);
  auto refuse = [&](const std::string& why, const std::string& hint) {
    if (context_) redisFree(context_);
    context_ = nullptr;
    throw InputError(fmt::format("Redis at {}: {}", where(), why), hint);
  };
  if (!context_) refuse("cannot allocate a connection", "");
  if (context_->err)
    refuse(fmt::format("cannot connect ({})", context_->errstr),
           "start the server (redis-server --port N --requirepass ...) or fix --redis");
  // Each system call stops at the timeout too; command() bounds the whole exchange.
  redisSetTimeout(context_, tv);
  // Start-up errors are refusals, not mid-run failures: no warning, no fallback here.
  const WarningSink user_warn = std::exchange(warn_, WarningSink{});
  std::string failure;
  const WarningSink capture = [&](const std::string& w) { failure = w; };
  warn_ = capture;
  if (!address_.password.empty()) {
    const std::string_view args[] = {"AUTH", address_.password};
    const std::unique_ptr<Reply> r = command(args);
    if (!r) refuse(fmt::format("no answer to AUTH ({})", failure), "is it a Redis server?");
    if (r->r->type == REDIS_REPLY_ERROR)
      refuse(fmt::format("the password was refused ({})", std::string(r->r->str, r->r->len)),
             "set CHOREO_REDIS_PASSWORD to the server's requirepass");
  }
  const std::string_view ping_args[] = {"PING"};
  const std::unique_ptr<Reply> ping = command(ping_args);
  if (!ping) refuse(fmt::format("no answer to PING ({})", failure), "is it a Redis server?");
  if (ping->r->type == REDIS_REPLY_ERROR)
    refuse(fmt::format("the server refused PING ({})", std::string(ping->r->str, ping->r->len)),
           "set CHOREO_REDIS_PASSWORD to the server's requirepass");
  warn_ = user_warn;
}

RedisStore::~RedisStore() {
  if (context_) redisFree(context_);
}

std::string RedisStore::where() const { return fmt::format("{}:{}", address_.host, address_.port); }

std::string RedisStore::key_name(uint64_t content_key) const { return "choreo:kv:" + key_hex(content_key); }

void RedisStore::fail(const std::string& what) const {
  if (warn_)
    warn_(fmt::format("Redis at {} stopped answering ({}); going on without it (encodings are recomputed)",
                      where(), what));
  if (context_) redisFree(context_);
  context_ = nullptr;
}

std::unique_ptr<RedisStore::Reply> RedisStore::command(std::span<const std::string_view> args) const {
  if (!context_) return nullptr;
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  uint64_t sent = 0;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
    sent += a.size();
  }
  const SteadyClock::time_point start = SteadyClock::now();
  SteadyClock::time_point deadline = start + limits_.timeout + transfer_time(sent, limits_);
  const auto late = [&] {
    return fmt::format("no whole reply within {} ms",
                       std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start).count());
  };
  if (redisAppendCommandArgv(context_, int(argv.size()), argv.data(), lengths.data()) != REDIS_OK) {
    fail(context_->errstr);
    return nullptr;
  }
  for (int done = 0; !done;) {
    if (!wait_for(context_->fd, POLLOUT, deadline)) {
      fail(fmt::format("the command was not taken within {} ms",
                       std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start).count()));
      return nullptr;
    }
    if (redisBufferWrite(context_, &done) != REDIS_OK) {
      fail(context_->errstr);
      return nullptr;
    }
  }
  // The reply. A bulk reply's announced length is checked before its bytes are read, and extends the
  // deadline by the time its bytes may take; the buffer never grows past the largest value allowed.
  bool announced = false;
  for (;;) {
    const redisReader* reader = context_->reader;
    const std::string_view pending(reader->buf + reader->pos, reader->len - reader->pos);
    if (!announced) {
      const std::optional<int64_t> n = announced_length(pending);
      if (n && *n == -2) {
        fail("a malformed reply");
        return nullptr;
      }
      if (n && *n > int64_t(limits_.max_value_bytes)) {
        fail(fmt::format("a reply announced a value of {} bytes, more than the {} bytes of the largest entry this "
                         "run can use",
                         *n, limits_.max_value_bytes));
        return nullptr;
      }
      if (n) {
        announced = true;
        if (*n > 0) deadline += transfer_time(uint64_t(*n), limits_);
      }
    }
    if (announced) {
      void* reply = nullptr;
      if (redisGetReplyFromReader(context_, &reply) != REDIS_OK) {
        fail(context_->errstr);
        return nullptr;
      }
      if (reply) return std::make_unique<Reply>(static_cast<redisReply*>(reply));
    }
    if (pending.size() > limits_.max_value_bytes + 4096) {
      fail(fmt::format("a reply longer than the {} bytes of the largest entry this run can use",
                       limits_.max_value_bytes));
      return nullptr;
    }
    if (!wait_for(context_->fd, POLLIN, deadline)) {
      fail(late());
      return nullptr;
    }
    if (redisBufferRead(context_) != REDIS_OK) {
      fail(context_->errstr);
      return nullptr;
    }
  }
}

bool RedisStore::put(uint64_t content_key, std::span<const uint8_t> value) {
  if (value.size() > limits_.max_value_bytes) return false;
  const std::string key = key_name(content_key);
  const std::string_view args[] = {"SET", key,
                                   {reinterpret_cast<const char*>(value.data()), value.size()}};
  const std::unique_ptr<Reply> r = command(args);
  if (!r) return false;
  if (r->r->type == REDIS_REPLY_ERROR) {
    fail(std::string(r->r->str, r->r->len));
    return false;
  }
  ++puts_;
  return true;
}

std::optional<std::vector<uint8_t>> RedisStore::get(uint64_t content_key) {
  const std::string key = key_name(content_key);
  const std::string_view args[] = {"GET", key};
  const std::unique_ptr<Reply> r = command(args);
  if (!r) return std::nullopt;
  if (r->r->type == REDIS_REPLY_ERROR) {
    fail(std::string(r->r->str, r->r->len));
    return std::nullopt;
  }
  if (r->r->type != REDIS_REPLY_STRING) return std::nullopt;
  ++hits_;
  return std::vector<uint8_t>(r->r->str, r->r->str + r->r->len);
}

bool RedisStore::holds(uint64_t content_key) const {
  const std::string key = key_name(content_key);
  const std::string_view args[] = {"EXISTS", key};
  const std::unique_ptr<Reply> r = command(args);
  return r && r->r->type == REDIS_REPLY_INTEGER && r->r->integer > 0;
}

std::optional<std::pair<size_t, uint64_t>> RedisStore::usage() {
  size_t n = 0;
  uint64_t bytes = 0;
  std::string cursor = "0";
  do {
    const std::string_view args[] = {"SCAN", cursor, "MATCH", "choreo:kv:*", "COUNT", "1000"};
    const std::unique_ptr<Reply> r = command(args);
    if (!r) return std::nullopt;
    if (r->r->type != REDIS_REPLY_ARRAY || r->r->elements != 2) {
      fail("unexpected SCAN reply");
      return std::nullopt;
    }
    cursor.assign(r->r->element[0]->str, r->r->element[0]->len);
    const redisReply* keys = r->r->element[1];
    for (size_t i = 0; i < keys->elements; ++i) {
      const std::string_view len_args[] = {"STRLEN", {keys->element[i]->str, keys->element[i]->len}};
      const std::unique_ptr<Reply> len = command(len_args);
      if (!len) return std::nullopt;
      ++n;
      if (len->r->type == REDIS_REPLY_INTEGER) bytes += uint64_t(len->r->integer);
    }
  } while (cursor != "0");
  return std::make_pair(n, bytes);
}

Opened RedisStore::open(uint64_t key, const Compatibility& expect) {
  std::optional<std::vector<uint8_t>> bytes = get(key);
  if (!bytes) return {};
  ParsedEntry parsed = check_entry(*bytes, key, expect, auth_ ? &*auth_ : nullptr);
  if (parsed.problem != EntryProblem::Ok) {
    report_bad(key, describe(parsed.problem));
    return {nullptr, true};
  }
  return {std::make_unique<BufferedEntry>(std::move(*bytes), std::move(parsed)), false};
}

namespace {
/// A value read on a connection of the finishing thread's own (a connection serves one thread at a time).
class RedisRead final : public PendingEntry {
 public:
  RedisRead(RedisAddress address, RedisLimits limits, std::optional<EntryAuthenticator> auth, uint64_t key,
            Compatibility expect)
      : address_(std::move(address)), limits_(limits), auth_(std::move(auth)), key_(key), expect_(expect) {}
  Opened finish(std::string& problem) override {
    std::optional<std::vector<uint8_t>> bytes;
    try {
      RedisStore connection(address_, {}, limits_, auth_);
      bytes = connection.get(key_);
    } catch (const std::exception&) {
      return {};  // the server went away: a miss; the call reads (or recomputes) it itself
    }
    if (!bytes) return {};
    ParsedEntry parsed = check_entry(*bytes, key_, expect_, auth_ ? &*auth_ : nullptr);
    if (parsed.problem != EntryProblem::Ok) {
      problem = std::string(describe(parsed.problem));
      return {nullptr, true};
    }
    return {std::make_unique<BufferedEntry>(std::move(*bytes), std::move(parsed)), false};
  }

 private:
  RedisAddress address_;
  RedisLimits limits_;
  std::optional<EntryAuthenticator> auth_;
  uint64_t key_;
  Compatibility expect_;
};
}  // namespace

std::unique_ptr<PendingEntry> RedisStore::begin_open(uint64_t key, const Compatibility& expect, bool* bad) {
  if (bad) *bad = false;
  if (!usable()) return nullptr;
  return std::make_unique<RedisRead>(address_, limits_, auth_, key, expect);
}

std::optional<uint64_t> RedisStore::save(const EntryMeta& meta, std::span<const std::byte* const> pages,
                                         std::span<const std::span<const uint8_t>> e_sections) {
  if (!usable()) return std::nullopt;
  std::vector<std::span<const uint8_t>> body;  // the pages, then the E caches
  for (const std::byte* page : pages) body.push_back({reinterpret_cast<const uint8_t*>(page), meta.page_bytes()});
  for (std::span<const uint8_t> e : e_sections) body.push_back(e);
  const std::vector<uint8_t> entry = encode_entry(meta, body, auth_ ? &*auth_ : nullptr);
  if (!put(meta.content_key, entry)) return std::nullopt;
  return entry.size();
}

void RedisStore::report_bad(uint64_t content_key, std::string_view what) {
  if (std::find(reported_.begin(), reported_.end(), content_key) != reported_.end()) return;
  reported_.push_back(content_key);
  if (warn_)
    warn_(fmt::format("Redis entry {} at {}: {}; ignoring it (it will be re-encoded)", key_name(content_key), where(),
                      what));
}

}  // namespace choreo::store
