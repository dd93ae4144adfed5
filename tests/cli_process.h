#pragma once
// Runs the real `choreo` binary from a test: the one beside the test binary (both live in the build dir), or
// $CHOREO_BIN.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
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
  bool exited = false;  // false: killed by a signal
  int exit_code = -1;   // when exited
  int signal = 0;       // when killed
  std::string out, err;
};

/// Runs `binary args...` to the end with stdout and stderr captured (through files in `scratch`).
inline ProcessResult run_process(const std::string& binary, const std::vector<std::string>& args,
                                 const std::filesystem::path& scratch) {
  const std::filesystem::path out_path = scratch / "stdout.txt", err_path = scratch / "stderr.txt";
  std::vector<std::string> arg_strings{binary};
  arg_strings.insert(arg_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : arg_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ProcessResult result;
  if (rc != 0) {
    result.err = "posix_spawn failed for " + binary;
    return result;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  result.exited = WIFEXITED(status);
  result.exit_code = result.exited ? WEXITSTATUS(status) : -1;
  result.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  result.out = read_file(out_path);
  result.err = read_file(err_path);
  return result;
}

}  // namespace choreo::testing
