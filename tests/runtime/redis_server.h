#pragma once
// Debian's redis-server for tests of T3 (runtime/store/redis_store.h): started on 127.0.0.1 with a password
// on a free port, no persistence, in a scratch directory.

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "runtime/store/redis_store.h"
#include "tests/scratch_dir.h"

extern char** environ;

namespace choreo::testing {

inline constexpr const char* kRedisPassword = "choreo-test-password";

/// A port nothing listens on right now (the kernel's pick).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

/// Debian's redis-server on 127.0.0.1 with a password, no persistence, in a scratch directory; stopped
/// (SIGKILL) when this goes out of scope or on kill().
class RedisServer {
 public:
  RedisServer() : port_(free_port()) {
    const std::string binary = "/usr/bin/redis-server";
    REQUIRE_MESSAGE(access(binary.c_str(), X_OK) == 0,
                    "redis-server is not installed: scripts/setup.sh installs it (Debian package redis-server)");
    std::vector<std::string> args = {binary,       "--port",       std::to_string(port_), "--bind", "127.0.0.1",
                                     "--requirepass", kRedisPassword,   "--save",              "",       "--appendonly",
                                     "no",         "--dir",        dir_.str(),            "--logfile", (dir_.path / "log").string()};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ) == 0);
    // Ready when it answers.
    for (int i = 0;; ++i) {
      try {
        store::RedisStore probe({"127.0.0.1", port_, kRedisPassword});
        break;
      } catch (const InputError&) {
        REQUIRE_MESSAGE(i < 100, "redis-server did not start within 5 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  ~RedisServer() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  ScratchDir dir_;
  int port_;
  pid_t pid_ = 0;
};

}  // namespace choreo::testing
