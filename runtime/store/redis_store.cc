#include "runtime/store/redis_store.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include <hiredis/hiredis.h>

#include "common/error.h"

namespace choreo::store {

namespace {

/// One reply, freed when it goes out of scope.
struct Reply {
  redisReply* r = nullptr;
  explicit Reply(void* p) : r(static_cast<redisReply*>(p)) {}
  ~Reply() {
    if (r) freeReplyObject(r);
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
};

timeval to_timeval(std::chrono::milliseconds t) {
  return {long(t.count() / 1000), long((t.count() % 1000) * 1000)};
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

RedisStore::RedisStore(const RedisAddress& address, WarningSink warn, std::chrono::milliseconds timeout)
    : address_(address), warn_(std::move(warn)) {
  const timeval tv = to_timeval(timeout);
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
  redisSetTimeout(context_, tv);
  if (!address_.password.empty()) {
    Reply r(redisCommand(context_, "AUTH %b", address_.password.data(), address_.password.size()));
    if (!r.r) refuse(fmt::format("no answer to AUTH ({})", context_->errstr), "is it a Redis server?");
    if (r.r->type == REDIS_REPLY_ERROR)
      refuse(fmt::format("the password was refused ({})", std::string(r.r->str, r.r->len)),
             "set CHOREO_REDIS_PASSWORD to the server's requirepass");
  }
  Reply ping(redisCommand(context_, "PING"));
  if (!ping.r) refuse(fmt::format("no answer to PING ({})", context_->errstr), "is it a Redis server?");
  if (ping.r->type == REDIS_REPLY_ERROR)
    refuse(fmt::format("the server refused PING ({})", std::string(ping.r->str, ping.r->len)),
           "set CHOREO_REDIS_PASSWORD to the server's requirepass");
}

RedisStore::~RedisStore() {
  if (context_) redisFree(context_);
}

std::string RedisStore::where() const { return fmt::format("{}:{}", address_.host, address_.port); }

std::string RedisStore::key_name(uint64_t content_key) const { return "choreo:kv:" + key_hex(content_key); }

void RedisStore::fail(const std::string& what) {
  if (warn_)
    warn_(fmt::format("Redis at {} stopped answering ({}); going on without it (encodings are recomputed)",
                      where(), what));
  redisFree(context_);
  context_ = nullptr;
}

bool RedisStore::put(uint64_t content_key, std::span<const uint8_t> entry) {
  if (!context_) return false;
  const std::string key = key_name(content_key);
  Reply r(redisCommand(context_, "SET %b %b", key.data(), key.size(), entry.data(), entry.size()));
  if (!r.r) {
    fail(context_->errstr);
    return false;
  }
  if (r.r->type == REDIS_REPLY_ERROR) {
    fail(std::string(r.r->str, r.r->len));
    return false;
  }
  ++puts_;
  return true;
}

std::optional<std::vector<uint8_t>> RedisStore::get(uint64_t content_key) {
  if (!context_) return std::nullopt;
  const std::string key = key_name(content_key);
  Reply r(redisCommand(context_, "GET %b", key.data(), key.size()));
  if (!r.r) {
    fail(context_->errstr);
    return std::nullopt;
  }
  if (r.r->type == REDIS_REPLY_ERROR) {
    fail(std::string(r.r->str, r.r->len));
    return std::nullopt;
  }
  if (r.r->type != REDIS_REPLY_STRING) return std::nullopt;
  ++hits_;
  return std::vector<uint8_t>(r.r->str, r.r->str + r.r->len);
}

std::optional<std::pair<size_t, uint64_t>> RedisStore::usage() {
  if (!context_) return std::nullopt;
  size_t n = 0;
  uint64_t bytes = 0;
  std::string cursor = "0";
  do {
    Reply r(redisCommand(context_, "SCAN %s MATCH choreo:kv:* COUNT 1000", cursor.c_str()));
    if (!r.r || r.r->type != REDIS_REPLY_ARRAY || r.r->elements != 2) {
      fail(r.r ? "unexpected SCAN reply" : context_->errstr);
      return std::nullopt;
    }
    cursor.assign(r.r->element[0]->str, r.r->element[0]->len);
    const redisReply* keys = r.r->element[1];
    for (size_t i = 0; i < keys->elements; ++i) {
      Reply len(redisCommand(context_, "STRLEN %b", keys->element[i]->str, keys->element[i]->len));
      if (!len.r) {
        fail(context_->errstr);
        return std::nullopt;
      }
      ++n;
      if (len.r->type == REDIS_REPLY_INTEGER) bytes += uint64_t(len.r->integer);
    }
  } while (cursor != "0");
  return std::make_pair(n, bytes);
}

void RedisStore::report_bad(uint64_t content_key, std::string_view what) {
  if (std::find(reported_.begin(), reported_.end(), content_key) != reported_.end()) return;
  reported_.push_back(content_key);
  if (warn_) warn_(fmt::format("Redis entry {} at {}: {}; ignoring it (it will be re-encoded)", key_name(content_key), where(), what));
}

}  // namespace choreo::store
