#include "runtime/serve/http_server.h"

#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <list>

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "common/error.h"

namespace choreo::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

/// Runs one asynchronous operation on the connection's own io_context until it completes or its deadline
/// passes (the stream is then closed and the operation ends with an error): a synchronous call with a
/// deadline for the whole operation, which Beast's synchronous calls do not have.
template <typename Start>
beast::error_code run_op(net::io_context& ioc, beast::tcp_stream& stream, std::chrono::seconds limit, Start start) {
  beast::error_code result = net::error::would_block;
  stream.expires_after(limit);
  start([&](beast::error_code ec, std::size_t) { result = ec; });
  ioc.restart();
  ioc.run();
  return result;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

/// The body of an error answered by the HTTP layer itself, in the shape of the API the path belongs to:
/// Anthropic's for /v1/messages, else OpenAI's (runtime/serve/api.cc writes the same for handler errors).
std::string error_json(const std::string& message, const std::string& type, const std::string& code,
                       const std::string& target = {}) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  if (target.rfind("/v1/messages", 0) == 0)
    return fmt::format(R"({{"type": "error", "error": {{"type": "{}", "message": "{}"}}}})",
                       type == "server_error" ? "api_error" : type, escaped);
  return fmt::format(R"({{"error": {{"message": "{}", "type": "{}", "code": "{}"}}}})", escaped, type, code);
}

/// What a connection is doing, as the accepting thread sees it when it must make room.
enum class Phase { Waiting, Reading, Handling };

/// A connection's answers.
class Responder final : public HttpResponder {
 public:
  Responder(net::io_context& ioc, beast::tcp_stream& stream, std::chrono::seconds timeout, bool keep_alive,
            unsigned version)
      : ioc_(ioc), stream_(stream), timeout_(timeout), keep_alive_(keep_alive), version_(version) {}

  void send(int status, const std::string& content_type, const std::string& body,
            const std::map<std::string, std::string>& headers = {}) override {
    if (sent_) return;
    sent_ = true;
    http::response<http::string_body> res{http::status(status), version_};
    res.set(http::field::content_type, content_type);
    res.set(http::field::server, "choreo");
    for (const auto& [name, value] : headers) res.set(name, value);
    res.keep_alive(keep_alive_);
    res.body() = body;
    res.prepare_payload();
    if (head_) {  // the header a GET would get, without its body
      http::response_serializer<http::string_body> serializer{res};
      ok_ = !run_op(ioc_, stream_, timeout_,
                    [&](auto handler) { http::async_write_header(stream_, serializer, handler); });
      return;
    }
    ok_ = !run_op(ioc_, stream_, timeout_, [&](auto handler) { http::async_write(stream_, res, handler); });
  }
  /// Answers a HEAD request: headers only.
  void set_head(bool head) { head_ = head; }

  void begin_stream(int status, const std::string& content_type) override {
    if (sent_) return;
    sent_ = streaming_ = true;
    http::response<http::empty_body> res{http::status(status), version_};
    res.set(http::field::content_type, content_type);
    res.set(http::field::cache_control, "no-cache");
    res.set(http::field::server, "choreo");
    res.keep_alive(keep_alive_);
    res.chunked(true);
    http::response_serializer<http::empty_body> serializer{res};
    ok_ = !run_op(ioc_, stream_, timeout_,
                  [&](auto handler) { http::async_write_header(stream_, serializer, handler); });
  }

  bool write(const std::string& chunk) override {
    if (!ok_ || !streaming_) return false;
    if (chunk.empty()) return true;
    ok_ = !run_op(ioc_, stream_, timeout_, [&](auto handler) {
      net::async_write(stream_, http::make_chunk(net::buffer(chunk)), handler);
    });
    return ok_;
  }

  /// Ends a stream (the last chunk).
  void finish() {
    if (!streaming_ || !ok_) return;
    ok_ = !run_op(ioc_, stream_, timeout_,
                  [&](auto handler) { net::async_write(stream_, http::make_chunk_last(), handler); });
  }

  bool sent() const override { return sent_; }
  bool ok() const { return ok_; }

  bool client_gone() override {
    char byte;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return false;   // bytes waiting (a pipelined request): still there
    if (n == 0) return true;   // the client closed its side
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // reset
  }

 private:
  net::io_context& ioc_;
  beast::tcp_stream& stream_;
  std::chrono::seconds timeout_;
  bool keep_alive_;
  unsigned version_;
  bool sent_ = false, streaming_ = false, ok_ = true, head_ = false;
};

/// After an answer sent before the request was read whole (413): stop sending, then read and drop what the
/// client still sends for a short while, so that it reads the answer instead of failing its write on a reset
/// connection (a lingering close, as web servers do).
void linger(net::io_context& ioc, beast::tcp_stream& stream) {
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  std::vector<char> sink(64 * 1024);
  size_t dropped = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!ec && dropped < (size_t(256) << 20) && std::chrono::steady_clock::now() < until) {
    size_t n = 0;
    ec = run_op(ioc, stream, std::chrono::seconds(2), [&](auto h) {
      stream.async_read_some(net::buffer(sink), [&n, h](beast::error_code e, size_t got) mutable {
        n = got;
        h(e, got);
      });
    });
    dropped += n;
  }
}

/// A connection as the server keeps it: what it is doing and since when, so that the accepting thread can close
/// the longest idle one when it needs room. `mutex` orders a close against the connection's own end and its
/// start of a request: a connection that has begun handling is never closed from outside.
struct Connection {
  std::mutex mutex;
  Phase phase = Phase::Waiting;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  int fd = -1;                     // while the connection's socket is open
  std::atomic<bool> evicted{false};  // closed from outside
  net::io_context* ioc = nullptr;

  /// The connection thread's own moves between phases; false when it was evicted meanwhile.
  bool enter(Phase p) {
    std::lock_guard lock(mutex);
    if (evicted) return false;
    phase = p;
    since = std::chrono::steady_clock::now();
    return true;
  }
};

/// One connection's requests, one after another, until it closes, fails a deadline, is evicted or the server
/// stops.
void serve_connection(net::io_context& ioc, tcp::socket socket, Connection& conn, const HttpLimits& limits,
                      const HttpHandler& handler, const std::atomic<bool>& stopping) {
  beast::tcp_stream stream(std::move(socket));
  {
    std::lock_guard lock(conn.mutex);
    conn.fd = stream.socket().native_handle();
  }
  beast::flat_buffer buffer;
  std::string peer;
  {
    beast::error_code ec;
    const tcp::endpoint remote = stream.socket().remote_endpoint(ec);
    if (!ec) peer = fmt::format("{}:{}", remote.address().to_string(), remote.port());
  }
  // An error the HTTP layer answers itself, then closes the connection.
  const auto refuse = [&](int status, const std::string& message, const char* type, const char* code,
                          const std::string& target) {
    Responder r(ioc, stream, std::chrono::seconds(5), false, 11);
    r.send(status, "application/json", error_json(message, type, code, target));
  };
  for (;;) {
    if (!conn.enter(Phase::Waiting)) break;
    // Idle until the request's first byte (a kept-alive connection between requests, or a new one).
    beast::error_code ec;
    if (buffer.size() == 0)
      ec = run_op(ioc, stream, limits.idle, [&](auto h) {
        stream.async_read_some(buffer.prepare(16 * 1024), [&buffer, h](beast::error_code e, size_t n) mutable {
          buffer.commit(n);
          h(e, n);
        });
      });
    if (ec || !conn.enter(Phase::Reading)) break;
    http::request_parser<http::string_body> parser;
    parser.body_limit(limits.max_body_bytes);
    parser.header_limit(64 * 1024);
    ec = run_op(ioc, stream, limits.header_timeout, [&](auto h) { http::async_read_header(stream, buffer, parser, h); });
    const std::string target = parser.is_header_done() ? std::string(parser.get().target()) : std::string();
    if (ec == http::error::header_limit) {
      refuse(431, "the request's header is larger than the server's limit of 65536 bytes", "invalid_request_error",
             "header_too_large", target);
      linger(ioc, stream);
      break;
    }
    if (!ec && !parser.is_done()) {
      // A client that asked to be told before it sends its body (Expect: 100-continue) is told now.
      if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        http::response<http::empty_body> go{http::status::continue_, 11};
        ec = run_op(ioc, stream, std::chrono::seconds(5), [&](auto h) { http::async_write(stream, go, h); });
      }
      if (!ec) ec = run_op(ioc, stream, limits.timeout, [&](auto h) { http::async_read(stream, buffer, parser, h); });
    }
    if (ec == http::error::body_limit) {
      refuse(413,
             fmt::format("the request is larger than the server's limit of {} bytes (--max-body-mib)",
                         limits.max_body_bytes),
             "invalid_request_error", "request_too_large", target);
      linger(ioc, stream);
      break;
    }
    if (ec) {
      // A deadline passed (Beast has closed the socket: nothing can be answered), the client left, or the
      // connection was evicted: it just ends.
      if (ec != http::error::end_of_stream && ec != net::error::operation_aborted && ec != beast::error::timeout &&
          ec != net::error::connection_reset && ec != net::error::would_block && ec != net::error::eof &&
          !conn.evicted)
        refuse(400, "malformed HTTP request: " + ec.message(), "invalid_request_error", "bad_http", target);
      break;
    }
    if (!conn.enter(Phase::Handling)) break;
    const http::request<http::string_body>& in = parser.get();
    HttpRequest req;
    req.method = std::string(in.method_string());
    req.target = std::string(in.target());
    for (const auto& field : in) req.headers[lower(std::string(field.name_string()))] = std::string(field.value());
    req.body = in.body();
    req.peer = peer;
    Responder r(ioc, stream, limits.timeout, in.keep_alive(), in.version());
    r.set_head(in.method() == http::verb::head);
    try {
      handler(req, r);
    } catch (const std::exception& e) {
      if (!r.sent()) r.send(500, "application/json", error_json(e.what(), "server_error", "internal", req.target));
    }
    if (!r.sent()) r.send(500, "application/json", error_json("no answer", "server_error", "internal", req.target));
    r.finish();
    if (!r.ok() || !in.keep_alive() || stopping) break;
  }
  std::lock_guard lock(conn.mutex);
  conn.fd = -1;
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream.socket().close(ignored);
}

}  // namespace

struct HttpServer::Impl {
  net::io_context accept_ioc;
  tcp::acceptor acceptor{accept_ioc};
  std::mutex mutex;
  std::condition_variable ended;
  std::list<std::shared_ptr<Connection>> live;  // stopped on shutdown; the longest idle one is evicted for room
  std::atomic<bool> stopping{false};

  /// Closes the connection that has waited longest for a request, else the one that has taken longest to send
  /// its request; false when every connection is running one.
  bool evict_one() {
    std::lock_guard lock(mutex);
    std::shared_ptr<Connection> best;
    Phase best_phase = Phase::Handling;
    std::chrono::steady_clock::time_point best_since{};
    for (const std::shared_ptr<Connection>& c : live) {
      std::lock_guard conn_lock(c->mutex);
      if (c->evicted || c->fd < 0 || c->phase == Phase::Handling) continue;
      const bool better = !best || (c->phase != best_phase ? c->phase == Phase::Waiting : c->since < best_since);
      if (!better) continue;
      best = c;
      best_phase = c->phase;
      best_since = c->since;
    }
    if (!best) return false;
    std::lock_guard conn_lock(best->mutex);
    if (best->evicted || best->fd < 0 || best->phase == Phase::Handling) return false;  // it moved on meanwhile
    best->evicted = true;
    ::shutdown(best->fd, SHUT_RDWR);  // its pending read ends; its own thread closes the socket
    return true;
  }
};

HttpServer::HttpServer(const std::string& host, int port, HttpLimits limits, HttpHandler handler)
    : impl_(std::make_unique<Impl>()), host_(host), limits_(limits), handler_(std::move(handler)) {
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (ec) throw InputError(fmt::format("--host {}: not an IP address", host), "give e.g. 127.0.0.1 or 0.0.0.0");
  const tcp::endpoint endpoint{address, static_cast<unsigned short>(port)};
  tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw InputError(fmt::format("cannot listen on {}:{}: {}", host, port, ec.message()),
                     "choose another --port, or stop what listens there");
  port_ = a.local_endpoint().port();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  if (impl_->stopping.exchange(true)) return;
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->accept_ioc.stop();
  std::unique_lock lock(impl_->mutex);
  for (const std::shared_ptr<Connection>& c : impl_->live) c->ioc->stop();
  impl_->ended.wait(lock, [&] { return connections_.load() == 0; });
}

void HttpServer::run() {
  while (!impl_->stopping) {
    auto ioc = std::make_unique<net::io_context>();
    beast::error_code ec;
    tcp::socket socket = impl_->acceptor.accept(*ioc, ec);
    if (ec) {
      if (impl_->stopping) break;
      continue;
    }
    // Full: an idle connection makes room (its thread ends on its own; the count may pass the limit by the
    // connections being closed meanwhile). Else the new one is answered at once, without reading its request.
    if (connections_.load() >= limits_.max_connections) {
      if (impl_->evict_one()) {
        ++evicted_;
      } else {
        ++refused_;
        beast::tcp_stream stream(std::move(socket));
        http::response<http::string_body> res{http::status::service_unavailable, 11};
        res.set(http::field::content_type, "application/json");
        res.set(http::field::retry_after, "1");
        res.keep_alive(false);
        res.body() = error_json("the server has too many connections running requests; retry later",
                                "server_error", "overloaded");
        res.prepare_payload();
        run_op(*ioc, stream, std::chrono::seconds(2), [&](auto h) { http::async_write(stream, res, h); });
        continue;
      }
    }
    ++connections_;
    auto conn = std::make_shared<Connection>();
    conn->ioc = ioc.get();
    {
      std::lock_guard lock(impl_->mutex);
      impl_->live.push_back(conn);
    }
    std::thread([this, conn, ioc = std::move(ioc), socket = std::move(socket)]() mutable {
      serve_connection(*ioc, std::move(socket), *conn, limits_, handler_, impl_->stopping);
      std::lock_guard lock(impl_->mutex);
      impl_->live.remove(conn);
      --connections_;
      impl_->ended.notify_all();
    }).detach();
  }
}

}  // namespace choreo::serve
