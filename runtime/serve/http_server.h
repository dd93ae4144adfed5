#pragma once
// The HTTP/1.1 side of `choreo serve`, on Boost.Beast (docs/serve.md says why Beast): a thread accepts
// connections and each connection gets a thread of its own, which reads a request, hands it to the handler and
// writes the answer, whole or as a stream of chunks, keeping the connection alive between requests. Every read
// and write has a deadline for the whole operation: a request's header must come within seconds of its first
// byte (`header_timeout`), its body within `timeout`, or the connection is closed (a client sending a byte a second is cut off at
// it), and each write within `timeout`. A body is refused past its limit while it is read (413), a header past
// 64 KiB too (431). Connections that are not running a request (idle between requests, or still sending one)
// hold no slot: when `max_connections` are open, the longest idle one is closed to admit a new one (as nginx
// reuses idle keep-alive connections), and only when every connection is running a request is the new one
// answered 503.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace choreo::serve {

/// A request as the handler sees it.
struct HttpRequest {
  std::string method;  // GET, POST, ...
  std::string target;  // path and query, e.g. /v1/chat/completions
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string peer;    // the client's address
  /// The value of a header, or "".
  std::string header(const std::string& lower_name) const {
    const auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

/// How the handler answers: once with send(), or with a stream (begin_stream, then write() chunks).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void send(int status, const std::string& content_type, const std::string& body,
                    const std::map<std::string, std::string>& headers = {}) = 0;
  virtual void begin_stream(int status, const std::string& content_type) = 0;
  /// False when the client is gone (or the write passed its deadline): stop generating for it.
  virtual bool write(const std::string& chunk) = 0;
  virtual bool sent() const = 0;
  /// True when the client has closed its side of the connection (or reset it), seen without reading or
  /// blocking: an answer being made for it can stop. Pipelined bytes do not count as gone.
  virtual bool client_gone() { return false; }
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

/// The server's limits.
struct HttpLimits {
  uint64_t max_body_bytes = uint64_t(16) << 20;  // 413 past it
  std::chrono::seconds timeout{600};             // a request's body, and each write of an answer
  std::chrono::seconds header_timeout{10};       // a request's header, from its first byte (then closed)
  std::chrono::seconds idle{600};                // a kept-alive connection with no request
  int max_connections = 256;                     // open at once; past it an idle one is closed, else 503
};

class HttpServer {
 public:
  /// Binds `host:port` (port 0: any free port; port() says which). Throws InputError when it cannot bind.
  HttpServer(const std::string& host, int port, HttpLimits limits, HttpHandler handler);
  /// Stops accepting, and waits for the connections to end (each within its deadlines).
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  /// Serves until stop() (from another thread, or a signal handler through it).
  void run();
  void stop();
  int connections() const { return connections_.load(); }
  /// Idle connections closed to admit new ones, and connections answered 503 because none was idle.
  uint64_t evicted() const { return evicted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
  HttpLimits limits_;
  HttpHandler handler_;
  std::atomic<int> connections_{0};
  std::atomic<uint64_t> evicted_{0}, refused_{0};
};

}  // namespace choreo::serve
