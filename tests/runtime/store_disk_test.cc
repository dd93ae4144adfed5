// The store directory (runtime/store/disk_store.h): entries round-trip through files, unusable files are
// reported once and treated as absent, gc evicts in LRU order, and neither killed writers nor concurrent
// processes can make a partial or corrupt file readable as an entry.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "runtime/kv/page_pool.h"
#include "runtime/store/disk_store.h"
#include "tests/runtime/store_test_util.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using store::DiskStore;
using testing::ScratchDir;
using testing::SyntheticEntry;

constexpr uint64_t kModel = 0xfeedull;

using testing::Warnings;

store::Compatibility compat(const kernels::KvLayout& layout = testing::small_layout()) {
  return {kModel, layout};
}

/// Reads an opened entry's pages as the tier manager does (store::read_entry), reporting a damaged page to
/// the store; false then.
bool read_pages(DiskStore& disk, const store::StoredEntry& entry, kv::PageList& pages) {
  pages.reserve(int(entry.meta().tokens.size()));
  std::map<int, std::vector<float>> no_e_cache;
  const std::optional<std::string> bad =
      store::read_entry(entry, pages.pages(), pages.pool().backend(), {}, no_e_cache);
  if (bad) disk.report_bad(entry.meta().content_key, *bad);
  return !bad;
}

/// True when the store holds exactly this entry: header fields and every page byte.
bool holds(DiskStore& disk, const SyntheticEntry& e) {
  const store::Opened m = disk.open(e.meta.content_key, compat(e.meta.layout));
  if (!m || m.entry->meta().tokens != e.meta.tokens || m.entry->meta().parents != e.meta.parents) return false;
  kv::PagePool pool(testing::cpu_backend(), e.meta.layout, size_t(64) << 20);
  kv::PageList pages(pool);
  if (!read_pages(disk, *m.entry, pages)) return false;
  const std::vector<std::byte> host = pages.to_host(e.pages.size());
  for (size_t i = 0; i < e.pages.size(); ++i)
    if (std::memcmp(host.data() + i * e.meta.page_bytes(), e.pages[i].data(), e.meta.page_bytes()) != 0)
      return false;
  return true;
}

void save(DiskStore& disk, const SyntheticEntry& e, const store::SaveOptions& options = {}) {
  std::vector<const std::byte*> p = e.page_pointers();
  disk.save(e.meta, p, {}, options);
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& de : fs::directory_iterator(dir)) names.push_back(de.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE(
    "store: a saved entry reads back byte for byte, only <key>.ckv (the lock and the marker) remain in the "
    "directory") {
  ScratchDir dir;
  Warnings w;
  DiskStore disk(dir.str(), true, w.sink());
  SyntheticEntry e = testing::synthetic_entry(0xabcull, 13, kModel);
  save(disk, e);
  CHECK(holds(disk, e));
  CHECK(names_in(dir.path) == std::vector<std::string>{"0000000000000abc.ckv", "CHOREO_STORE", "lock"});
  CHECK(!disk.open(0xabdull, compat()));  // absent: nothing, and no warning
  CHECK(w.lines.empty());
  std::vector<store::EntryInfo> listed = disk.list(true);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].key == 0xabcull);
  CHECK(listed[0].problem == store::EntryProblem::Ok);
  CHECK(listed[0].meta.tokens.size() == 13);
  CHECK(listed[0].bytes == fs::file_size(dir.path / "0000000000000abc.ckv"));
}

TEST_CASE(
    "store: another model, another layout, a corrupt page, a truncated or misnamed file are ignored and "
    "reported once") {
  ScratchDir dir;
  Warnings w;
  DiskStore disk(dir.str(), true, w.sink());
  SyntheticEntry e = testing::synthetic_entry(0x51ull, 9, kModel);
  save(disk, e);
  const std::string path = disk.entry_path(0x51ull);

  SUBCASE("another model's fingerprint") {
    CHECK(!disk.open(0x51ull, {kModel + 1, testing::small_layout()}));
    CHECK(!disk.open(0x51ull, {kModel + 1, testing::small_layout()}));
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("another model") != std::string::npos);
    CHECK(holds(disk, e));  // still fine for its own model
  }
  SUBCASE("another KV layout") {
    kernels::KvLayout other = testing::small_layout();
    other.page_tokens = 8;
    CHECK(!disk.open(0x51ull, compat(other)));
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("layout") != std::string::npos);
  }
  SUBCASE("a flipped byte in a page") {
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(fs::file_size(path) - 5));
      char c = 0;
      f.read(&c, 1);
      f.seekp(std::streamoff(fs::file_size(path) - 5));
      c ^= 0x40;
      f.write(&c, 1);
    }
    const store::Opened m = disk.open(0x51ull, compat());
    REQUIRE(m);  // the header is intact; the page is caught when copied
    kv::PagePool pool(testing::cpu_backend(), testing::small_layout(), size_t(1) << 20);
    kv::PageList pages(pool);
    CHECK(!read_pages(disk, *m.entry, pages));
    pages.clear();
    CHECK(!read_pages(disk, *m.entry, pages));
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("page checksum") != std::string::npos);
    CHECK(disk.list(true)[0].problem == store::EntryProblem::PageChecksum);
    CHECK(disk.list(false)[0].problem == store::EntryProblem::Ok);
    save(disk, e);  // re-encoding replaces it
    CHECK(holds(disk, e));
  }
  SUBCASE("a truncated file") {
    fs::resize_file(path, fs::file_size(path) - 1);
    CHECK(!disk.open(0x51ull, compat()));
    fs::resize_file(path, 100);
    CHECK(!disk.open(0x51ull, compat()));
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("truncated") != std::string::npos);
    fs::resize_file(path, 0);
    CHECK(!disk.open(0x51ull, compat()));
  }
  SUBCASE("a file named after another key") {
    fs::rename(path, disk.entry_path(0x52ull));
    CHECK(!disk.open(0x52ull, compat()));
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("file name") != std::string::npos);
  }
}

TEST_CASE("store gc: evicts least recently used first (hand-set last-use times) down to the budget") {
  ScratchDir dir;
  DiskStore disk(dir.str());
  const auto base = store::Clock::now() - std::chrono::hours(10);
  // Keys 1..6 with last uses in this hand-picked order (oldest first): 4, 2, 6, 1, 5, 3.
  const int age_rank[7] = {0, 4, 2, 6, 1, 5, 3};  // age_rank[key] = position in LRU order (1 = oldest)
  uint64_t entry_bytes = 0;
  for (uint64_t key = 1; key <= 6; ++key) {
    save(disk, testing::synthetic_entry(key, 8, kModel));
    disk.touch(key, base + std::chrono::minutes(age_rank[key]));
    entry_bytes = fs::file_size(disk.entry_path(key));
  }
  // Every entry has the same size (same token count and layout); keep room for exactly 3.
  store::GcReport r = disk.gc(3 * entry_bytes + entry_bytes / 2, std::chrono::hours(1));
  CHECK(r.entries_removed == 3);
  CHECK(r.entries_kept == 3);
  CHECK(r.bytes_kept == 3 * entry_bytes);
  std::vector<uint64_t> left;
  for (const store::EntryInfo& e : disk.list()) left.push_back(e.key);
  CHECK(left == std::vector<uint64_t>{1, 3, 5});  // the three most recently used (ranks 4, 6, 5)

  // A load-time touch makes the oldest survivor (1) the most recent: it now outlives 3 and 5.
  disk.touch(1);
  r = disk.gc(entry_bytes, std::chrono::hours(1));
  left.clear();
  for (const store::EntryInfo& e : disk.list()) left.push_back(e.key);
  CHECK(left == std::vector<uint64_t>{1});
  CHECK(disk.gc(0, std::chrono::hours(1)).entries_removed == 1);
  CHECK(disk.list().empty());
}

TEST_CASE(
    "store gc and rm: unreadable entries go, abandoned temp files go, a live writer's temp file stays") {
  ScratchDir dir;
  DiskStore disk(dir.str());
  save(disk, testing::synthetic_entry(0x10, 5, kModel));
  save(disk, testing::synthetic_entry(0x11, 5, kModel));
  std::ofstream(dir.path / "0000000000000099.ckv") << "garbage";             // unreadable entry
  std::ofstream(dir.path / ".0000000000000012.1.0.tmp") << "half an entry";  // abandoned by a crash
  std::ofstream(dir.path / ".0000000000000013.2.0.tmp") << "being written";  // a live writer's
  int live = ::open((dir.path / ".0000000000000013.2.0.tmp").c_str(), O_RDONLY);
  REQUIRE(live >= 0);
  REQUIRE(::flock(live, LOCK_EX) == 0);
  CHECK(disk.temp_files() == 2);
  // Temp files younger than the threshold stay whatever their lock; unreadable entries go at once.
  store::GcReport r = disk.gc(uint64_t(1) << 40, std::chrono::hours(1));
  CHECK(r.temp_files_removed == 0);
  CHECK(r.unusable_removed == 1);
  CHECK(r.entries_kept == 2);
  r = disk.gc(uint64_t(1) << 40, std::chrono::seconds(0));
  CHECK(r.temp_files_removed == 1);
  CHECK(r.unusable_removed == 0);
  CHECK(r.entries_kept == 2);
  CHECK(fs::exists(dir.path / ".0000000000000013.2.0.tmp"));
  ::close(live);
  CHECK(disk.remove(0x10));
  CHECK(!disk.remove(0x10));
  CHECK(disk.remove_all() == 1);
  CHECK(disk.list().empty());
  CHECK(disk.temp_files() == 0);  // no longer locked: remove_all took it
}

/// Forks; the child runs `body` and exits 0 (1 on an exception). Returns the child's pid.
template <class F>
pid_t spawn(F body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", int(::getpid()), e.what());
      code = 1;
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

kernels::KvLayout big_layout() {
  kernels::KvLayout l;  // 256 KiB pages
  l.page_tokens = 32;
  l.n_layers = 4;
  l.n_kv_heads = 4;
  l.head_dim = 64;
  return l;
}

TEST_CASE("store kill: a writer SIGKILLed mid-write leaves no entry, only a temp file that gc removes") {
  ScratchDir dir;
  Warnings w;
  DiskStore disk(dir.str(), true, w.sink());
  SyntheticEntry before = testing::synthetic_entry(0x1, 40, kModel, big_layout());
  save(disk, before);
  SyntheticEntry big = testing::synthetic_entry(0x2, 32 * 24, kModel, big_layout());  // 24 pages, 6 MiB

  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  pid_t child = spawn([&] {
    DiskStore child_disk(dir.str());
    store::SaveOptions slow;
    slow.after_page = [&](size_t page) {
      char c = char(page);
      (void)!::write(pipe_fds[1], &c, 1);  // "page written"
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    };
    save(child_disk, big, slow);
  });
  ::close(pipe_fds[1]);
  char c = 0;
  int pages_seen = 0;
  while (pages_seen < 10 && ::read(pipe_fds[0], &c, 1) == 1) ++pages_seen;  // kill it in the middle
  ::kill(child, SIGKILL);
  CHECK(wait_exit(child) == -SIGKILL);
  ::close(pipe_fds[0]);
  CHECK(pages_seen == 10);

  CHECK(!disk.open(0x2, compat(big_layout())));  // never visible, and not even "corrupt": simply absent
  CHECK(w.lines.empty());
  CHECK(disk.temp_files() == 1);
  std::vector<store::EntryInfo> listed = disk.list(true);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].key == 0x1);
  CHECK(holds(disk, before));
  store::GcReport r = disk.gc(uint64_t(1) << 40, std::chrono::seconds(0));  // the dead writer's lock is gone
  CHECK(r.temp_files_removed == 1);
  CHECK(disk.temp_files() == 0);
  CHECK(holds(disk, before));
}

TEST_CASE("store kill: writers killed at random moments never leave a readable partial entry") {
  ScratchDir dir;
  DiskStore disk(dir.str());
  std::mt19937 rng(12345);
  std::vector<SyntheticEntry> entries;
  for (uint64_t k = 0; k < 4; ++k)
    entries.push_back(testing::synthetic_entry(0x100 + k, 32 * 12, kModel, big_layout()));
  for (int round = 0; round < 6; ++round) {
    pid_t child = spawn([&] {
      DiskStore child_disk(dir.str());
      for (int i = 0;; ++i) save(child_disk, entries[size_t(i) % entries.size()]);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + rng() % 120));
    ::kill(child, SIGKILL);
    CHECK(wait_exit(child) == -SIGKILL);
    // Whatever was renamed into place is complete; everything else is a temp file.
    for (const store::EntryInfo& e : disk.list(true)) CHECK(e.problem == store::EntryProblem::Ok);
    for (const SyntheticEntry& e : entries)
      if (fs::exists(disk.entry_path(e.meta.content_key))) CHECK(holds(disk, e));
  }
  disk.gc(uint64_t(1) << 40, std::chrono::seconds(0));
  CHECK(disk.temp_files() == 0);
}

TEST_CASE("store concurrency: two processes writing the same and different entries while a third runs gc") {
  ScratchDir dir;
  const int rounds = 6;
  std::vector<SyntheticEntry> shared, mine[2];
  for (uint64_t k = 0; k < 4; ++k)
    shared.push_back(testing::synthetic_entry(0x500 + k, 32 * 3 + int(k), kModel, big_layout()));
  for (int p = 0; p < 2; ++p)
    for (uint64_t k = 0; k < 3; ++k)
      mine[p].push_back(
          testing::synthetic_entry(0x600 + 16 * uint64_t(p) + k, 20 + int(k), kModel, big_layout()));
  std::vector<pid_t> children;
  for (int p = 0; p < 2; ++p) {
    children.push_back(spawn([&, p] {
      DiskStore d(dir.str());
      for (int r = 0; r < rounds; ++r) {
        for (const SyntheticEntry& e : shared) save(d, e);
        for (const SyntheticEntry& e : mine[p]) save(d, e);
        // Readers race the other writer's renames: whatever they open must be whole.
        for (const SyntheticEntry& e : shared)
          if (fs::exists(d.entry_path(e.meta.content_key)) && !holds(d, e)) ::_exit(3);
      }
    }));
  }
  children.push_back(spawn([&] {
    DiskStore d(dir.str());
    for (int i = 0; i < 40; ++i) {
      d.gc(uint64_t(1) << 40, std::chrono::seconds(0));  // must never take a live writer's temp file
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }));
  for (pid_t c : children) CHECK(wait_exit(c) == 0);
  DiskStore disk(dir.str());
  for (const SyntheticEntry& e : shared) CHECK(holds(disk, e));
  for (int p = 0; p < 2; ++p)
    for (const SyntheticEntry& e : mine[p]) CHECK(holds(disk, e));
  std::vector<store::EntryInfo> listed = disk.list(true);
  CHECK(listed.size() == shared.size() + 6);
  for (const store::EntryInfo& e : listed) CHECK(e.problem == store::EntryProblem::Ok);
  CHECK(disk.temp_files() == 0);
}

}  // namespace
}  // namespace choreo
