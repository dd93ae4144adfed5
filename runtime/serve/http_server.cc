#include "runtime/serve/http_server.h"

#include <utility>  // before Boost.Asio, whose awaitable.hpp uses std::exchange
#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <list>

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

std::string error_json(const std::string& message, const std::string& type, const std::string& code) {
  // The OpenAI error shape (runtime/serve/openai_api.cc writes the same for handler errors).
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  return fmt::format(R"({{"error": {{"message": "{}", "type": "{}", "code": "{}"}}}})", escaped, type, code);
}

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
    ok_ = !run_op(ioc_, stream_, timeout_, [&](auto handler) { http::async_write(stream_, res, handler); });
  }

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

 private:
  net::io_context& ioc_;
  beast::tcp_stream& stream_;
  std::chrono::seconds timeout_;
  bool keep_alive_;
  unsigned version_;
  bool sent_ = false, streaming_ = false, ok_ = true;
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

/// One connection's requests, one after another, until it closes, fails a deadline or the server stops.
void serve_connection(net::io_context& ioc, tcp::socket socket, const HttpLimits& limits, const HttpHandler& handler,
                      const std::atomic<bool>& stopping) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  std::string peer;
  {
    beast::error_code ec;
    const tcp::endpoint remote = stream.socket().remote_endpoint(ec);
    if (!ec) peer = fmt::format("{}:{}", remote.address().to_string(), remote.port());
  }
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(limits.max_body_bytes);
    parser.header_limit(64 * 1024);
    beast::error_code ec =
        run_op(ioc, stream, limits.idle, [&](auto h) { http::async_read_header(stream, buffer, parser, h); });
    if (!ec && !parser.is_done())
      ec = run_op(ioc, stream, limits.timeout, [&](auto h) { http::async_read(stream, buffer, parser, h); });
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      Responder r(ioc, stream, std::chrono::seconds(5), false, 11);
      r.send(413, "application/json",
             error_json(fmt::format("the request is larger than the server's limit of {} bytes (--max-body-mib)",
                                    limits.max_body_bytes),
                        "invalid_request_error", "request_too_large"));
      linger(ioc, stream);
      break;
    }
    if (ec) {
      if (ec != http::error::end_of_stream && ec != net::error::operation_aborted && ec != beast::error::timeout &&
          ec != net::error::connection_reset && ec != net::error::would_block) {
        Responder r(ioc, stream, std::chrono::seconds(5), false, 11);
        r.send(400, "application/json", error_json("malformed HTTP request: " + ec.message(), "invalid_request_error", "bad_http"));
      }
      break;
    }
    const http::request<http::string_body>& in = parser.get();
    HttpRequest req;
    req.method = std::string(in.method_string());
    req.target = std::string(in.target());
    for (const auto& field : in) req.headers[lower(std::string(field.name_string()))] = std::string(field.value());
    req.body = in.body();
    req.peer = peer;
    Responder r(ioc, stream, limits.timeout, in.keep_alive(), in.version());
    try {
      handler(req, r);
    } catch (const std::exception& e) {
      if (!r.sent()) r.send(500, "application/json", error_json(e.what(), "server_error", "internal"));
    }
    if (!r.sent()) r.send(500, "application/json", error_json("no answer", "server_error", "internal"));
    r.finish();
    if (!r.ok() || !in.keep_alive() || stopping) break;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

}  // namespace

struct HttpServer::Impl {
  net::io_context accept_ioc;
  tcp::acceptor acceptor{accept_ioc};
  std::mutex mutex;
  std::condition_variable ended;
  std::list<net::io_context*> live;  // connections' contexts, stopped on shutdown
  std::atomic<bool> stopping{false};
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
  for (net::io_context* ioc : impl_->live) ioc->stop();
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
    if (connections_.load() >= limits_.max_connections) {
      // Answered at once, without reading the request: the server is full.
      beast::tcp_stream stream(std::move(socket));
      http::response<http::string_body> res{http::status::service_unavailable, 11};
      res.set(http::field::content_type, "application/json");
      res.keep_alive(false);
      res.body() = error_json("the server has too many connections; retry later", "server_error", "overloaded");
      res.prepare_payload();
      run_op(*ioc, stream, std::chrono::seconds(2), [&](auto h) { http::async_write(stream, res, h); });
      continue;
    }
    ++connections_;
    std::thread([this, ioc = std::move(ioc), socket = std::move(socket)]() mutable {
      {
        std::lock_guard lock(impl_->mutex);
        impl_->live.push_back(ioc.get());
      }
      serve_connection(*ioc, std::move(socket), limits_, handler_, impl_->stopping);
      std::lock_guard lock(impl_->mutex);
      impl_->live.remove(ioc.get());
      --connections_;
      impl_->ended.notify_all();
    }).detach();
  }
}

}  // namespace choreo::serve
