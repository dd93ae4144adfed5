// Worker threads of a many-instance run (`choreo run --inputs ROWS --concurrency K`, runtime/exec/scheduler).
// `--concurrency 400` used to end in std::terminate (SIGABRT) as soon as a thread could not be created: the
// run now starts no more workers than the process limits leave room for (thread_room.h), and when starting
// one fails anyway it joins the ones it started and exits 1 with a message. The limits are made real for the
// child only: RLIMIT_AS (prlimit --as) makes pthread_create fail for want of stack memory even for root, and
// RLIMIT_NPROC is enforced by running the child as `nobody` (setpriv), since the kernel exempts root from it.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/exec/thread_room.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

TEST_CASE("thread room: within 0..kMaxConcurrency, and what is reserved is taken off") {
  const int room = exec::thread_room(0);
  CHECK(room >= 1);  // this test process can start a thread
  CHECK(room <= exec::kMaxConcurrency);
  CHECK(exec::thread_room(1 << 30) == 0);  // a reserve larger than any room leaves none
}

/// A workflow with one input and a two-token decode, and `n` rows for it.
struct ManyRows {
  testing::ScratchDir scratch;
  fs::path workflow = scratch.path / "w.yaml", rows = scratch.path / "rows.jsonl";
  explicit ManyRows(int n) {
    std::ofstream(workflow)
        << "name: w\ninputs: {problem: string}\nmessages:\n  a: {text: \"Once upon a time "
           "{{ problem }}\"}\nsteps:\n  - decode: {as: b, parents: [a], header: \"There\", "
           "max_tokens: 2}\noutput: \"{{ b }}\"\n";
    std::ofstream out(rows);
    for (int i = 0; i < n; ++i) out << "{\"problem\": \"row " << i << "\"}\n";
  }
  /// `wrapper... choreo run` with 400 instances in flight.
  std::vector<std::string> command(std::vector<std::string> wrapper) const {
    for (const std::string& a :
         {testing::choreo_binary(), std::string("run"), workflow.string(), std::string("-m"),
          testing::shared_file("models/stories260K.gguf"), std::string("--inputs"), rows.string(),
          std::string("--concurrency"), std::string("400"), std::string("-t"), std::string("1"),
          std::string("--cache-mib"), std::string("64"), std::string("--no-store")})
      wrapper.push_back(a);
    return wrapper;
  }
};

/// Runs a command whose first word is a program on the PATH of a Debian system (util-linux).
testing::ProcessResult run_wrapped(const std::vector<std::string>& command, const fs::path& scratch) {
  const std::string program = "/usr/bin/" + command[0];
  REQUIRE_MESSAGE(fs::exists(program), program, " is missing (util-linux)");
  REQUIRE_MESSAGE(fs::exists(testing::choreo_binary()), "no choreo binary (build it, or set CHOREO_BIN)");
  return testing::run_process(program, std::vector<std::string>(command.begin() + 1, command.end()), scratch);
}

TEST_SUITE("hostile") {
  TEST_CASE("threads: when memory for worker stacks runs out, run exits 1 with a message, not a signal") {
    ManyRows many(400);
    // 400 MiB of address space holds the model and ~50 stacks of 8 MiB, not 400.
    const testing::ProcessResult r =
        run_wrapped(many.command({"prlimit", "--as=419430400", "--stack=8388608", "--"}), many.scratch.path);
    CAPTURE(r.err);
    CHECK(r.exited);
    CHECK(r.signal == 0);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("cannot start worker thread") != std::string::npos);
    CHECK(r.err.find("--concurrency") != std::string::npos);
    CHECK(r.out.find("── row") == std::string::npos);  // no instance ran: all or nothing
  }

  TEST_CASE(
      "threads: under a low RLIMIT_NPROC (as nobody) --concurrency 400 runs every row on fewer workers") {
    REQUIRE_MESSAGE(fs::exists("/usr/bin/setpriv"), "setpriv is missing (util-linux)");
    ManyRows many(400);
    // Everything the child reads must be readable by nobody; what it writes is opened before it drops root.
    fs::permissions(many.scratch.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                           fs::perms::others_read | fs::perms::others_exec);
    const testing::ProcessResult r =
        run_wrapped(many.command({"prlimit", "--nproc=24", "--", "/usr/bin/setpriv", "--reuid=65534",
                                  "--regid=65534", "--clear-groups", "--"}),
                    many.scratch.path);
    CAPTURE(r.err);
    CHECK(r.exited);
    CHECK(r.signal == 0);
    CHECK(r.exit_code == 0);
    int outputs = 0;
    for (size_t at = r.out.find("output\n"); at != std::string::npos; at = r.out.find("output\n", at + 1))
      ++outputs;
    CHECK(outputs == 400);
  }
}

}  // namespace
}  // namespace choreo
