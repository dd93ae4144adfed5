// Issue 5: "Kill a `choreo encode` mid-write: the store stays readable and the partial entry is discarded."
// Runs the real `choreo` binary (next to this test binary, or $CHOREO_BIN) on a schema of many union members
// with stories260K, SIGKILLs it at several moments while it writes to a scratch --cache-dir, and checks after
// each kill that every entry present verifies page by page and that no temporary file counts as an entry;
// then that complete runs finish the store (the second computes nothing), and that `cache stat` and `cache
// gc` leave it consistent. Most kills use the store's test hook CHOREO_STORE_PAUSE_AFTER_PAGE_MS
// (docs/store.md), which slows each write so that the kill lands inside one; one kill comes at a random time
// without it. The tiers' kills (issue 11) do the same to `choreo run` while eviction writes to T2, and while
// a workflow both offloads to T2 and prefetches from it.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/store/disk_store.h"
#include "tests/cli_process.h"
#include "tests/runtime/store_test_util.h"
#include "tests/test_paths.h"

namespace fs = std::filesystem;
using namespace choreo;

namespace {

using testing::choreo_binary;
using testing::computed_and_loaded;

/// A child process with its stdout and stderr in one file.
struct Child {
  pid_t pid = -1;
  std::string output_path;
};

Child spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
            const std::string& output_path) {
  std::vector<std::string> env_strings(extra_env);
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> env, argv;
  for (std::string& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::vector<std::string> arg_strings(args);
  for (std::string& s : arg_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Child child{-1, output_path};
  const int rc = posix_spawn(&child.pid, argv[0], &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "cannot start ", args[0]);
  return child;
}

/// Waits for the child; its exit code, or 128 + the signal that ended it.
int wait_for(const Child& child) {
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Run {
  int exit_code = -1;
  std::string output;
};

Run run_to_end(const std::vector<std::string>& args, const std::string& output_path) {
  Child c = spawn(args, {}, output_path);
  Run r;
  r.exit_code = wait_for(c);
  r.output = read_text(output_path);
  return r;
}

/// A schema of one shared opening and three unions of 40 members each (no role tags: stories260K has no chat
/// template). Every member is one store entry, so an encode writes 121 entries.
std::string many_member_schema() {
  static const char* kWords[] = {"cat",  "dog",  "tree", "ball", "sun",  "boat", "bird", "cake",
                                 "fish", "moon", "star", "frog", "park", "rain", "shoe", "bear"};
  std::string s = "<schema name=\"kill\">\n  Once upon a time there was a little girl who liked stories.\n";
  for (int u = 0; u < 3; ++u) {
    s += "  <union>\n";
    for (int m = 0; m < 40; ++m) {
      const std::string id = std::to_string(u) + "-" + std::to_string(m);  // no two members alike
      s += "    <module name=\"u" + std::to_string(u) + "m" + std::to_string(m) + "\">Story " + id +
           ": she saw a";
      for (int w = 0; w < 12; ++w) s += std::string(" ") + kWords[(u * 7 + m * 3 + w * 5) % 16];
      s += " and smiled.</module>\n";
    }
    s += "  </union>\n";
  }
  return s + "</schema>\n";
}

struct DirCounts {
  size_t entries = 0;  // *.ckv
  size_t temps = 0;    // *.tmp
  std::vector<std::string> temp_names;
};

DirCounts count_files(const fs::path& dir) {
  DirCounts c;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".ckv")) ++c.entries;
    if (name.ends_with(".tmp")) {
      ++c.temps;
      c.temp_names.push_back(name);
    }
  }
  return c;
}

/// What must hold after any kill: every entry verifies, only `<16 hex>.ckv` files are entries, and a temp
/// file's key has no entry unless a complete write of that key was renamed into place.
void check_store_consistent(const fs::path& dir) {
  store::DiskStore disk(dir.string(), false);
  const std::vector<store::EntryInfo> entries = disk.list(/*verify_pages=*/true);
  const DirCounts files = count_files(dir);
  CHECK(entries.size() == files.entries);
  CHECK(disk.temp_files() == files.temps);
  static const std::regex kEntryName("[0-9a-f]{16}\\.ckv");
  for (const store::EntryInfo& e : entries) {
    INFO("entry ", e.path);
    CHECK(e.problem == store::EntryProblem::Ok);
    CHECK(std::regex_match(fs::path(e.path).filename().string(), kEntryName));
  }
  for (const std::string& temp : files.temp_names) {
    // `.<key>.ckv.<random>.tmp`: the key it was writing must not be readable through that temp file. A kill
    // while the store's marker is written leaves `.CHOREO_STORE.<random>.tmp`, which names no key.
    if (temp.starts_with(".CHOREO_STORE.")) continue;
    std::optional<uint64_t> key = store::parse_key_hex(temp.substr(1, 16));
    REQUIRE_MESSAGE(key, temp);
    if (!fs::exists(disk.entry_path(*key))) CHECK_FALSE(disk.open(*key, store::Compatibility{}));
  }
}

}  // namespace

TEST_CASE(
    "encode kill: a choreo encode killed mid-write leaves a readable store, the partial entry is discarded") {
  const std::string binary = choreo_binary();
  REQUIRE_MESSAGE(fs::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
  const std::string model = testing::shared_file("models/stories260K.gguf");
  testing::ScratchDir scratch;
  const fs::path schema = scratch.path / "kill.pml", cache = scratch.path / "store";
  std::ofstream(schema) << many_member_schema();
  const std::vector<std::string> encode = {binary, "encode", schema.string(), "-m",          model,
                                           "-t",   "1",      "--cache-dir",   cache.string()};
  const std::string log = (scratch.path / "out.txt").string();

  // What a complete encode computes, without any store.
  std::vector<std::string> no_store = encode;
  no_store.push_back("--no-store");
  const auto reference_start = std::chrono::steady_clock::now();
  Run reference = run_to_end(no_store, log);
  const double reference_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - reference_start).count();
  REQUIRE_MESSAGE(reference.exit_code == 0, reference.output);
  std::smatch m;
  REQUIRE(std::regex_search(reference.output, m, std::regex(R"(encoded: (\d+) tokens computed)")));
  const int total_tokens = std::stoi(m[1]);
  CHECK(total_tokens > 0);
  CHECK_FALSE(fs::exists(cache));  // --no-store touches no store

  const unsigned seed = std::random_device{}();
  INFO("kill-moment seed ", seed);
  std::mt19937 rng(seed);
  bool killed_mid_write = false;
  for (int round = 0; round < 5; ++round) {
    INFO("kill round ", round);
    const bool paced = round < 3;  // the last two kills come at random times, without the hook
    std::vector<std::string> env;
    if (paced) env.push_back("CHOREO_STORE_PAUSE_AFTER_PAGE_MS=50");
    const DirCounts before = count_files(cache);
    const size_t entries_before = before.entries;
    const size_t wanted = entries_before + std::uniform_int_distribution<size_t>(0, 8)(rng);
    Child child = spawn(encode, env, log);
    const auto start = std::chrono::steady_clock::now();
    // An unpaced run takes about as long as the reference plus its writes: kill within 0.5-2x that.
    const auto random_moment =
        std::chrono::milliseconds(int(std::uniform_real_distribution<double>(0.5, 2.0)(rng) * reference_ms));
    bool exited = false;
    for (;;) {
      int status = 0;
      if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
        exited = true;  // finished (or failed) before the moment came: checked below all the same
        INFO(read_text(log));
        CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
        break;
      }
      const auto elapsed = std::chrono::steady_clock::now() - start;
      const DirCounts now = count_files(cache);
      const bool moment =
          paced ? now.entries >= wanted && now.temps > before.temps : elapsed >= random_moment;
      if (moment || elapsed > std::chrono::seconds(120)) {
        REQUIRE_MESSAGE(elapsed <= std::chrono::seconds(120),
                        "the encode never reached a write: ", read_text(log));
        ::kill(child.pid, SIGKILL);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!exited) {
      // The child may finish between the poll above and the kill (the kill then reaches a zombie and does
      // nothing): a clean exit is as good as a kill here, and the store is checked the same way.
      const int code = wait_for(child);
      CHECK_MESSAGE((code == 128 + SIGKILL || code == 0), "exit code ", code, ": ", read_text(log));
      if (code == 0) exited = true;
    }
    check_store_consistent(cache);
    // The hook keeps each write open for 50 ms per page, so a kill that follows the sight of a new temp file
    // almost always interrupts that write (its temp file stays); at least one round must have.
    if (paced && !exited && count_files(cache).temps > before.temps) killed_mid_write = true;
  }
  const DirCounts after_kills = count_files(cache);
  MESSAGE("after the kills: ", after_kills.entries, " entries, ", after_kills.temps, " partial writes left");
  CHECK(killed_mid_write);

  // A complete run finishes the store; a second one loads everything and computes nothing.
  Run finish = run_to_end(encode, log);
  REQUIRE_MESSAGE(finish.exit_code == 0, finish.output);
  auto [computed, loaded] = computed_and_loaded(finish.output);
  CHECK(computed + loaded == total_tokens);
  Run again = run_to_end(encode, log);
  REQUIRE_MESSAGE(again.exit_code == 0, again.output);
  CHECK(computed_and_loaded(again.output) == std::pair<int, int>(0, total_tokens));
  check_store_consistent(cache);

  // `cache stat` sees no corrupt entry; `cache gc` removes the dead writers' temp files and keeps every
  // entry.
  const size_t entries = count_files(cache).entries;
  Run stat = run_to_end({binary, "cache", "stat", "--cache-dir", cache.string()}, log);
  REQUIRE_MESSAGE(stat.exit_code == 0, stat.output);
  CHECK(stat.output.find("corrupt:       0\n") != std::string::npos);
  CHECK(stat.output.find("entries:       " + std::to_string(entries) + " ") != std::string::npos);
  Run gc = run_to_end(
      {binary, "cache", "gc", "--cache-dir", cache.string(), "--max-mib", "1024", "--stale-minutes", "0"},
      log);
  REQUIRE_MESSAGE(gc.exit_code == 0, gc.output);
  CHECK(count_files(cache).temps == 0);
  CHECK(count_files(cache).entries == entries);
  check_store_consistent(cache);
  Run after_gc = run_to_end(encode, log);
  REQUIRE_MESSAGE(after_gc.exit_code == 0, after_gc.output);
  CHECK(computed_and_loaded(after_gc.output) == std::pair<int, int>(0, total_tokens));
}

/// A tiered `choreo run` killed `kills` times, each time once a T2 write is under way (a temp file exists)
/// and `k * stagger_ms` later, the store checked after every kill; then run to the end, which must print
/// what the same run without tiers prints, with each of `expect` in its output (the cache line).
struct TierKills {
  std::vector<std::string> run;         // the binary, "run", the workflow and its inputs
  std::vector<std::string> tier_flags;  // budgets and policy; --cache-dir is added
  int kills = 3;
  int pause_ms = 30;                    // CHOREO_STORE_PAUSE_AFTER_PAGE_MS: slows each write
  int stagger_ms = 10;
  bool fresh_store = false;             // every killed run starts from an empty store
  std::vector<std::string> expect;
};

void check_tier_kills(const TierKills& t, const fs::path& scratch) {
  const fs::path cache = scratch / "store";
  std::vector<std::string> tiered = t.run;
  tiered.insert(tiered.end(), t.tier_flags.begin(), t.tier_flags.end());
  tiered.insert(tiered.end(), {"--cache-dir", cache.string()});
  const std::string log = (scratch / "out.txt").string();
  std::vector<std::string> plain = t.run;
  plain.push_back("--no-store");
  const Run reference = run_to_end(plain, log);
  REQUIRE_MESSAGE(reference.exit_code == 0, reference.output);
  int killed_mid_write = 0;
  for (int round = 0; round < t.kills; ++round) {
    INFO("kill round ", round);
    if (t.fresh_store) fs::remove_all(cache);
    // Temp files an earlier round's kill left are not this run's writes.
    const std::vector<std::string> old_temps = count_files(cache).temp_names;
    const auto new_temp = [&]() -> std::optional<std::string> {
      for (const std::string& name : count_files(cache).temp_names)
        if (std::find(old_temps.begin(), old_temps.end(), name) == old_temps.end()) return name;
      return std::nullopt;
    };
    Child child = spawn(tiered, {"CHOREO_STORE_PAUSE_AFTER_PAGE_MS=" + std::to_string(t.pause_ms)}, log);
    // Kill once one of this run's writes is under way, or after 20 s.
    const auto start = std::chrono::steady_clock::now();
    std::optional<std::string> writing;
    while (!(writing = new_temp()) && std::chrono::steady_clock::now() - start < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(t.stagger_ms * round));
    ::kill(child.pid, SIGKILL);
    const int code = wait_for(child);
    // The kill landed in the middle of a write when the process died of it and the temp file it was writing
    // is still there (a finished write renames it away; the paced writes keep each open for pause_ms a page).
    if (writing && code == 128 + SIGKILL && fs::exists(cache / *writing)) ++killed_mid_write;
    if (fs::exists(cache)) check_store_consistent(cache);
  }
  // As in the encode-kill case: at least one kill must have interrupted a write, or the store was never put
  // to the test.
  MESSAGE(killed_mid_write, " of ", t.kills, " kills landed in the middle of a T2 write");
  CHECK(killed_mid_write > 0);
  // A complete run over what the kills left: the same text as a run without tiers.
  if (t.fresh_store) fs::remove_all(cache);
  const Run done = run_to_end(tiered, log);
  REQUIRE_MESSAGE(done.exit_code == 0, done.output);
  for (const std::string& e : t.expect) CHECK_MESSAGE(done.output.find(e) != std::string::npos, e);
  check_store_consistent(cache);
  auto text_of = [](const std::string& out) { return out.substr(0, out.find("summary:")); };
  CHECK(text_of(done.output) == text_of(reference.output));
}

std::string source_file(const std::string& relative) {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  return (fs::path(src ? src : ".") / relative).string();
}

TEST_CASE("tiers kill: a run killed while eviction writes to T2 leaves a consistent store, and the run completes after") {
  // madpar on stories260K with T0 far below its working set: answers leave T0 for the store (T2) as the run
  // goes. The store's test hook slows each write so that the kill lands inside one.
  testing::ScratchDir scratch;
  TierKills t;
  t.run = {choreo_binary(), "run", source_file("workflows/madpar.yaml"), "-m",
           testing::shared_file("models/stories260K.gguf"), "-t", "1", "--input", "problem=What is 2+3?"};
  t.tier_flags = {"--cache-mib", "5", "--disk-cache-mib", "64", "--evict", "lru"};
  t.expect = {"writes to and"};  // the cache line: T2 was written
  check_tier_kills(t, scratch.path);
}

TEST_CASE("tiers kill: a run killed while it offloads to T2 and prefetches from it leaves a consistent store") {
  // KVFlow's round-robin workflow on stories260K: 8 agents with ~250-token documents, T0 room for about 3.
  // Workflow eviction writes the prompts read last to T2 and prefetches them back from it before their turns,
  // so the run moves pages both ways all along; it is killed at staggered moments.
  testing::ScratchDir scratch;
  const fs::path rows = scratch.path / "rows.jsonl";
  {
    std::ofstream f(rows);
    f << "{\"docs\": [";
    for (int k = 0; k < 8; ++k) {
      f << (k ? ", " : "") << '"';
      for (int s = 0; s < 12; ++s)
        f << "Agent " << k << " keeps note " << s << ": the little fox found " << (k * 12 + s) << " red apples. ";
      f << '"';
    }
    f << "]}\n";
  }
  TierKills t;
  t.run = {choreo_binary(), "run", source_file("benchmarks/workflows/kvflow.yaml"), "-m",
           testing::shared_file("models/stories260K.gguf"), "-t", "1", "--inputs", rows.string(), "--param",
           "agents=8", "--param", "rounds=2"};
  t.tier_flags = {"--cache-mib", "1", "--disk-cache-mib", "64", "--evict", "workflow", "--prefetch-steps", "2"};
  t.kills = 4;
  t.pause_ms = 3;
  t.stagger_ms = 40;
  t.fresh_store = true;
  t.expect = {" prefetches (", "writes to and"};
  check_tier_kills(t, scratch.path);
}
