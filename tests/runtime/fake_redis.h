#pragma once
// A small hostile stand-in for a Redis server (issue 42's findings 2 and 3): it speaks enough of RESP for a
// RedisStore to connect (AUTH, PING), then answers GET the way a test asks: a reply trickled one byte at a
// time, or a bulk reply announcing a value of several gigabytes. SET and EXISTS are acknowledged.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/runtime/redis_server.h"

namespace choreo::testing {

class FakeRedis {
 public:
  /// What GET gets: a function writing to the connection (it may block, sleep, write forever: it is stopped
  /// when the test ends, by `stopping()` turning true).
  using GetReply = std::function<void(int fd, const std::function<bool()>& stopping)>;

  explicit FakeRedis(GetReply get) : get_(std::move(get)), port_(free_port()) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port_));
    REQUIRE(bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(listener_, 8) == 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeRedis() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }
  int port() const { return port_; }

  /// Writes all of `data` unless the peer went away.
  static bool send_all(int fd, std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(size_t(n));
    }
    return true;
  }

 private:
  // Reads one RESP array of bulk strings (a command) from `fd`; empty when the peer went away or on stop.
  std::vector<std::string> read_command(int fd) {
    std::vector<std::string> args;
    auto line = [&]() -> std::optional<std::string> {
      std::string out;
      char c = 0;
      while (!stop_) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        if (::recv(fd, &c, 1, 0) != 1) return std::nullopt;
        if (c == '\n' && !out.empty() && out.back() == '\r') {
          out.pop_back();
          return out;
        }
        out += c;
      }
      return std::nullopt;
    };
    const std::optional<std::string> head = line();
    if (!head || head->empty() || (*head)[0] != '*') return {};
    const int n = std::stoi(head->substr(1));
    for (int i = 0; i < n; ++i) {
      const std::optional<std::string> len = line();
      if (!len) return {};
      std::string arg(size_t(std::stoll(len->substr(1))) + 2, '\0');
      size_t got = 0;
      while (got < arg.size()) {
        const ssize_t r = ::recv(fd, arg.data() + got, arg.size() - got, 0);
        if (r <= 0) return {};
        got += size_t(r);
      }
      arg.resize(arg.size() - 2);
      args.push_back(std::move(arg));
    }
    return args;
  }

  void serve() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      for (;;) {
        const std::vector<std::string> cmd = read_command(fd);
        if (cmd.empty()) break;
        const std::string& name = cmd[0];
        if (name == "AUTH" || name == "SET") {
          send_all(fd, "+OK\r\n");
        } else if (name == "PING") {
          send_all(fd, "+PONG\r\n");
        } else if (name == "EXISTS") {
          send_all(fd, ":0\r\n");
        } else if (name == "GET") {
          get_(fd, [this] { return stop_.load(); });
        } else {
          send_all(fd, "-ERR unknown command\r\n");
        }
      }
      close(fd);
    }
  }

  GetReply get_;
  int port_;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace choreo::testing
