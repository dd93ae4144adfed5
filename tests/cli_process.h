#pragma once
// Runs the real `choreo` binary from a test: the one beside the test binary (both live in the build dir), or
// $CHOREO_BIN.

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/scratch_dir.h"

extern char** environ;

namespace choreo::testing {

/// The choreo binary: $CHOREO_BIN, else `choreo` beside the running test binary.
inline std::string choreo_binary() {
  if (const char* env = std::getenv("CHOREO_BIN")) return env;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "choreo").string();
}

/// How a finished child ended and what it printed.
struct ProcessResult {
  bool exited = false;     // false: killed by a signal
  int exit_code = -1;      // when exited
  int signal = 0;          // when killed
  bool timed_out = false;  // killed (SIGKILL) by run_process because it ran past its time limit
  long max_rss_kib = 0;    // the child's peak resident memory
  std::string out, err;
};

/// What else a child gets.
struct ProcessOptions {
  double timeout_seconds = 300;       // then SIGKILL: a hang fails the test instead of the suite
  std::vector<std::string> env;       // extra KEY=VALUE entries, added to (or replacing in) this environment
  std::string stdin_path = "/dev/null";
};

/// Runs `binary args...` to the end (or to the time limit) with stdout and stderr captured (through files in
/// `scratch`).
inline ProcessResult run_process(const std::string& binary, const std::vector<std::string>& args,
                                 const std::filesystem::path& scratch, const ProcessOptions& options = {}) {
  const std::filesystem::path out_path = scratch / "stdout.txt", err_path = scratch / "stderr.txt";
  std::vector<std::string> arg_strings{binary};
  arg_strings.insert(arg_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : arg_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const std::string& extra : options.env) replaced |= extra.substr(0, extra.find('=')) == key;
    if (!replaced) env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), options.env.begin(), options.env.end());
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, options.stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ProcessResult result;
  if (rc != 0) {
    result.err = "posix_spawn failed for " + binary;
    return result;
  }
  int status = 0;
  struct rusage usage {};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_seconds);
  for (;;) {
    const pid_t done = ::wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
      }
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  result.exited = WIFEXITED(status);
  result.exit_code = result.exited ? WEXITSTATUS(status) : -1;
  result.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  result.max_rss_kib = usage.ru_maxrss;
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  return result;
}

/// Runs `choreo args... -m model` in `scratch` (its stdout and stderr captured there).
inline ProcessResult run_choreo_on(const std::string& model, const ScratchDir& scratch, std::vector<std::string> args,
                                   double timeout_seconds = 300) {
  args.insert(args.end(), {"-m", model});
  ProcessOptions options;
  options.timeout_seconds = timeout_seconds;
  return run_process(choreo_binary(), args, scratch.path, options);
}

/// An ending that is no crash and no hang: a normal exit with code 0, 1 or 2.
inline bool ended_cleanly(const ProcessResult& r) { return r.exited && !r.timed_out && r.exit_code >= 0 && r.exit_code <= 2; }

}  // namespace choreo::testing
