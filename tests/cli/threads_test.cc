// Worker threads of a many-instance run (`choreo run --inputs ROWS --concurrency K`, runtime/exec/scheduler).
// `--concurrency 400` used to end in std::terminate (SIGABRT) as soon as a thread could not be created, and
// later in a std::bad_alloc for every row: the run now starts no more workers than the process limits leave
// room for, in threads and in address space (thread_room.h), and when starting one fails anyway it joins the
// ones it started and exits 1 with a message. The limits are made real for the child only: RLIMIT_AS
// (prlimit --as) bounds address space even for root, and RLIMIT_NPROC is enforced by running the child as
// `nobody` (setpriv), since the kernel exempts root from it.

#include <doctest/doctest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
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

/// This process's address space in use (VmSize), in bytes.
uint64_t address_space_used() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("VmSize:")) return uint64_t(std::stoull(line.substr(7))) * 1024;
  return 0;
}

TEST_CASE("memory room: no limit leaves kMaxConcurrency, a limit leaves room for fewer the lower it is") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_AS, &saved) == 0);
  if (saved.rlim_cur == RLIM_INFINITY) CHECK(exec::memory_room() == exec::kMaxConcurrency);
  // The soft limit is lowered for a moment (nothing else runs meanwhile) and put back.
  const auto room_with = [&](uint64_t headroom) {
    const uint64_t limit = address_space_used() + headroom;
    rlimit lowered = saved;
    lowered.rlim_cur = saved.rlim_max == RLIM_INFINITY ? limit : std::min<uint64_t>(limit, saved.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_AS, &lowered) == 0);
    const int room = exec::memory_room();
    REQUIRE(::setrlimit(RLIMIT_AS, &saved) == 0);
    return room;
  };
  CHECK(room_with(uint64_t(1) << 20) == 0);  // a MiB holds no stack
  const int one_gib = room_with(uint64_t(1) << 30), four_gib = room_with(uint64_t(4) << 30);
  CHECK(one_gib >= 1);
  CHECK(four_gib > one_gib);
  CHECK(four_gib < 400);  // 8 MiB stacks alone would take 3.2 GiB
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

/// What a many-instance run printed as each row's output ("── row N output" and the line after it), by row.
std::map<std::string, std::string> outputs_by_row(const std::string& out) {
  std::map<std::string, std::string> outputs;
  std::istringstream in(out);
  std::string line, text;
  while (std::getline(in, line))
    if (line.starts_with("── row ") && line.ends_with(" output") && std::getline(in, text))
      outputs[line] = text;
  return outputs;
}

TEST_SUITE("hostile") {
  // Each worker costs its stack and, up to glibc's arena limit, a 64 MiB malloc arena of address space: 400
  // of them fit in neither limit. Under 400 MiB no worker could start (exit 1); under 4 GiB every row failed
  // with std::bad_alloc (exit 2; issue 42, finding 6). Now fewer run at once, and each row's output is the
  // one a run without limits gives.
  TEST_CASE("threads: under a 4 GiB or a 400 MiB address-space limit --concurrency 400 runs every row") {
    ManyRows many(400);
    const testing::ProcessResult free_run = run_wrapped(many.command({"env", "--"}), many.scratch.path);
    REQUIRE(free_run.exit_code == 0);
    const std::map<std::string, std::string> expected = outputs_by_row(free_run.out);
    REQUIRE(expected.size() == 400);
    for (const char* limit : {"--as=4294967296", "--as=419430400"}) {
      CAPTURE(limit);
      const testing::ProcessResult r =
          run_wrapped(many.command({"prlimit", limit, "--stack=8388608", "--"}), many.scratch.path);
      CAPTURE(r.err);
      CHECK(r.exited);
      CHECK(r.signal == 0);
      CHECK(r.exit_code == 0);
      CHECK(outputs_by_row(r.out) == expected);
    }
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
    CHECK(outputs_by_row(r.out).size() == 400);
  }
}

}  // namespace
}  // namespace choreo
