#include "runtime/store/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"

namespace choreo::store {

namespace fs = std::filesystem;

namespace {

std::string errno_text() { return std::strerror(errno); }

constexpr std::string_view kEntrySuffix = ".ckv";
constexpr std::string_view kTempSuffix = ".tmp";

constexpr std::string_view kNotRegular =
    "not a regular file (a FIFO, symlink, directory, socket or device); skipping it";

/// Holds a flock on `<dir>/lock` for its lifetime.
class DirLock {
 public:
  DirLock(const std::string& dir, int operation) {
    std::string path = dir + "/lock";
    // O_NOFOLLOW | O_NONBLOCK: a symlink at the lock's name is not followed (nor created through), a FIFO
    // does not block; either is refused below.
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    struct stat st;
    if (fd_ >= 0 && (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))) {
      ::close(fd_);
      fd_ = -1;
      errno = EINVAL;
    }
    if (fd_ < 0)
      throw RuntimeFailure(
          fmt::format("cannot use the store lock {}: {} (it must be a regular file; remove "
                      "whatever is there and choreo recreates it)",
                      path, errno == EINVAL || errno == ELOOP ? "not a regular file" : errno_text()));
    while (::flock(fd_, operation) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw RuntimeFailure(fmt::format("cannot lock {}: {}", path, errno_text()));
      }
    }
  }
  ~DirLock() { ::close(fd_); }  // closing releases the lock
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// The key of an entry file name `<16 hex>.ckv`, or nullopt for any other name.
std::optional<uint64_t> entry_key_of(std::string_view name) {
  if (name.size() != 16 + kEntrySuffix.size() || !ends_with(name, kEntrySuffix)) return std::nullopt;
  return parse_key_hex(name.substr(0, 16));
}

Clock::time_point mtime_of(const struct stat& st) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

/// True when `path` is a regular file itself (not a symlink to one); lstat's result in `st`.
bool is_regular(const std::string& path, struct stat& st) {
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// Removes a temporary file unless a live writer holds its lock (a killed writer's lock is gone). Only a
/// regular file is opened (without blocking, without following a link); anything else is left alone.
bool remove_temp_if_abandoned(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return false;
  }
  bool removed = false;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) removed = ::unlink(path.c_str()) == 0;
  ::close(fd);
  return removed;
}

/// Test hook (tests/runtime/encode_kill_test.cc): $CHOREO_STORE_PAUSE_AFTER_PAGE_MS > 0 makes every write
/// sleep that long after each page, so a test can SIGKILL a writer inside a write. Unset: no pause.
int pause_after_page_ms() {
  static const int ms = [] {
    const char* env = std::getenv("CHOREO_STORE_PAUSE_AFTER_PAGE_MS");
    return env ? std::clamp(std::atoi(env), 0, 60000) : 0;
  }();
  return ms;
}

uint64_t unix_ms_now() {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count());
}

}  // namespace

std::string key_hex(uint64_t key) { return fmt::format("{:016x}", key); }

std::optional<uint64_t> parse_key_hex(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t key = 0;
  for (char c : text) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
    if (digit < 0) return std::nullopt;
    key = key << 4 | uint64_t(digit);
  }
  return key;
}

DiskStore::DiskStore(std::string dir, bool create, WarningSink warn, std::optional<EntryAuthenticator> auth)
    : dir_(std::move(dir)), warn_(std::move(warn)), auth_(std::move(auth)) {
  if (dir_.empty()) throw InputError("the cache directory is empty", "give --cache-dir DIR");
  if (!warn_) warn_ = [](const std::string& line) { std::fprintf(stderr, "warning: %s\n", line.c_str()); };
  std::error_code ec;
  if (create && !fs::exists(dir_, ec)) {
    fs::path leaf(dir_);
    if (!leaf.has_filename()) leaf = leaf.parent_path();  // "dir/"
    fs::create_directories(leaf.parent_path(), ec);
    // Only the owner may enter a store choreo creates: entries hold prompt tokens, and whoever can write
    // the directory can forge entries (docs/store.md, "Threat model"). A failure shows just below.
    (void)::mkdir(leaf.c_str(), 0700);
  }
  if (!fs::is_directory(dir_, ec)) {
    throw InputError(fmt::format("cache directory {} {}", dir_,
                                 fs::exists(dir_, ec) ? "is not a directory" : "does not exist"),
                     create ? "check the permissions of its parent, or pick another --cache-dir"
                            : "give an existing --cache-dir, or set CHOREO_CACHE_DIR");
  }
  if (create) claim();
}

bool DiskStore::marked() const { return marker_state(dir_) == MarkerState::Valid; }

void DiskStore::claim() {
  if (claimed_) return;
  const std::string marker = dir_ + "/" + std::string(kMarkerName);
  switch (marker_state(dir_)) {
    case MarkerState::Valid:
      break;
    case MarkerState::Invalid:
      throw InputError(
          fmt::format("{} is not a choreo store marker, so {} is not used as a store", marker, dir_),
          "point --cache-dir (or $CHOREO_CACHE_DIR) at a store, a new directory or an empty one");
    case MarkerState::Absent:
      // A store written before markers existed holds only store-named files: adopt it. Anything else is
      // somebody's directory, which choreo must not fill (or later gc).
      if (std::optional<std::string> foreign = first_foreign_name(dir_))
        throw InputError(
            fmt::format("{} is not a choreo store: it has no {} marker and holds other files (e.g. '{}')",
                        dir_, kMarkerName, *foreign),
            "point --cache-dir (or $CHOREO_CACHE_DIR) at a store, a new directory or an empty one");
      {
        // Under the directory lock, shared: gc, which holds it exclusively while it removes temporary files,
        // must not take the marker's temporary file from under its writer (it did: a writer's rename then
        // failed with ENOENT). A lock that cannot be taken (a symlink or FIFO at its name) is reported by the
        // first save, as before; the marker is then written without it.
        std::optional<DirLock> shared;
        try {
          shared.emplace(dir_, LOCK_SH);
        } catch (const RuntimeFailure&) {
        }
        if (marker_state(dir_) == MarkerState::Absent) write_marker(dir_);
      }
      break;
  }
  claimed_ = true;
}

void DiskStore::require_marker() const {
  if (marked()) return;
  throw InputError(
      fmt::format("{} is not a choreo store (no valid {} marker file): refusing to delete anything in it",
                  dir_, kMarkerName),
      "check --cache-dir and $CHOREO_CACHE_DIR. A store written by an older choreo is marked by its next "
      "write "
      "(e.g. `choreo encode`); docs/store.md explains the marker");
}

std::string DiskStore::entry_path(uint64_t key) const {
  return dir_ + "/" + key_hex(key) + std::string(kEntrySuffix);
}

void DiskStore::report(const std::string& path, std::string_view what) const {
  if (warned_.insert(path).second)
    warn_(fmt::format("store entry {}: {}; ignoring it (it will be re-encoded)", path, what));
}

std::optional<uint64_t> DiskStore::save(const EntryMeta& meta, std::span<const std::byte* const> pages,
                                        std::span<const std::span<const uint8_t>> e_sections) {
  if (!save(meta, pages, e_sections, SaveOptions{})) return std::nullopt;
  struct stat st;
  return is_regular(entry_path(meta.content_key), st) ? uint64_t(st.st_size) : 0;
}

bool DiskStore::save(const EntryMeta& meta_in, std::span<const std::byte* const> pages,
                     std::span<const std::span<const uint8_t>> e_sections, const SaveOptions& options) {
  claim();
  EntryMeta meta = meta_in;
  if (meta.created_unix_ms == 0) meta.created_unix_ms = unix_ms_now();
  const size_t page_bytes = meta.page_bytes();
  if (pages.size() != meta.n_pages() || meta.tokens.empty())
    throw RuntimeFailure(fmt::format("store: entry {} has {} pages for {} tokens", key_hex(meta.content_key),
                                     pages.size(), meta.tokens.size()));
  if (e_sections.size() != meta.e_layers.size() ||
      std::any_of(e_sections.begin(), e_sections.end(),
                  [&](std::span<const uint8_t> e) { return e.size() != meta.e_section_bytes(); }))
    throw RuntimeFailure(fmt::format("store: entry {} has {} E-cache sections for {} layers",
                                     key_hex(meta.content_key), e_sections.size(), meta.e_layers.size()));
  std::vector<std::span<const uint8_t>> body;  // the pages, then the E-cache sections
  std::vector<uint64_t> checksums;
  for (const std::byte* page : pages) {
    body.emplace_back(reinterpret_cast<const uint8_t*>(page), page_bytes);
    checksums.push_back(XXH3_64bits(page, page_bytes));
  }
  for (std::span<const uint8_t> e : e_sections) {
    body.push_back(e);
    checksums.push_back(XXH3_64bits(e.data(), e.size()));
  }
  std::vector<uint8_t> header = encode_header(meta, checksums, auth_ ? kMacHmacSha256 : kMacNone);
  if (auth_) sign_header(header, body, *auth_);

  const std::string final_path = entry_path(meta.content_key);
  std::optional<TemporaryFile> temp;
  {
    // The temporary file (`.<key>.ckv.<random>.tmp`, created O_EXCL | O_NOFOLLOW by the one output writer)
    // carries its own lock, which tells gc it belongs to a live writer (the kernel drops it if we die). It is
    // created and locked under the directory lock, so gc (holding that exclusively) never sees it unlocked.
    DirLock shared(dir_, LOCK_SH);
    temp.emplace(final_path);
    if (::flock(temp->fd(), LOCK_EX) != 0)
      throw RuntimeFailure(fmt::format("cannot lock {}: {}", temp->path(), errno_text()));
  }
  auto bytes_of = [](const void* data, size_t n) { return std::string_view(static_cast<const char*>(data), n); };
  write_all_or_throw(temp->fd(), bytes_of(header.data(), header.size()), temp->path());
  for (size_t i = 0; i < pages.size(); ++i) {
    write_all_or_throw(temp->fd(), bytes_of(pages[i], page_bytes), temp->path());
    if (options.after_page) options.after_page(i);
    if (const int pause_ms = pause_after_page_ms())
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  for (std::span<const uint8_t> e : e_sections)
    write_all_or_throw(temp->fd(), bytes_of(e.data(), e.size()), temp->path());
  bool published = false;
  {
    DirLock shared(dir_, LOCK_SH);
    published = temp->publish();  // false: a directory holds the entry's name
  }
  if (!published) {
    report(final_path, "a directory holds this entry's name, so it cannot be written");
    return false;
  }
  ++entries_written_;
  warned_.erase(final_path);  // a fresh file deserves a fresh report if it goes bad
  return true;
}

bool DiskStore::has_file(uint64_t key) const {
  struct stat st;
  return is_regular(entry_path(key), st);
}

Opened DiskStore::open(uint64_t key, const Compatibility& expect) {
  const std::string path = entry_path(key);
  MapFailure failure = MapFailure::None;
  std::optional<MappedFile> file = MappedFile::open(path, &failure);
  if (!file) {
    if (failure == MapFailure::NotRegularFile) report(path, kNotRegular);
    if (failure == MapFailure::Unreadable) report(path, "cannot be opened or mapped");
    return {nullptr, failure != MapFailure::None && failure != MapFailure::Missing};
  }
  ParsedEntry parsed = check_entry(file->bytes(), key, expect, auth_ ? &*auth_ : nullptr);
  if (parsed.problem != EntryProblem::Ok) {
    report(path, describe(parsed.problem));
    return {nullptr, true};
  }
  return {std::make_unique<MappedEntry>(std::move(*file), std::move(parsed)), false};
}

std::unique_ptr<PendingEntry> DiskStore::begin_open(uint64_t key, const Compatibility& expect, bool* bad) {
  Opened opened = open(key, expect);
  if (bad) *bad = opened.bad;
  if (!opened.entry) return nullptr;
  return std::make_unique<ReadyEntry>(std::move(opened));
}

void DiskStore::touch(uint64_t key, std::optional<Clock::time_point> when) {
  struct timespec times[2];
  times[0].tv_nsec = UTIME_OMIT;
  times[0].tv_sec = 0;
  if (when) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when->time_since_epoch()).count();
    times[1].tv_sec = time_t(ns / 1000000000);
    times[1].tv_nsec = long(ns % 1000000000);
  } else {
    times[1].tv_sec = 0;
    times[1].tv_nsec = UTIME_NOW;
  }
  // Best effort: an entry removed meanwhile, or owned by another user, simply keeps its old time. A symlink
  // swapped in at the name is not followed.
  (void)::utimensat(AT_FDCWD, entry_path(key).c_str(), times, AT_SYMLINK_NOFOLLOW);
}

std::vector<EntryInfo> DiskStore::list(bool verify_pages) const {
  std::vector<EntryInfo> out;
  std::error_code ec;
  for (const fs::directory_entry& de : fs::directory_iterator(dir_, ec)) {
    std::string name = de.path().filename().string();
    std::optional<uint64_t> key = entry_key_of(name);
    if (!key) continue;
    EntryInfo info;
    info.key = *key;
    info.path = de.path().string();
    MapFailure failure = MapFailure::None;
    std::optional<MappedFile> file = MappedFile::open(info.path, &failure);
    if (!file) {
      if (failure == MapFailure::NotRegularFile) report(info.path, kNotRegular);
      continue;  // removed meanwhile, or unreadable
    }
    struct stat st;
    if (::lstat(info.path.c_str(), &st) != 0) continue;
    info.bytes = file->bytes().size();
    info.last_use = mtime_of(st);
    ParsedEntry parsed = parse_entry(file->bytes());
    info.problem = parsed.problem;
    if (info.problem == EntryProblem::Ok && parsed.meta.content_key != *key)
      info.problem = EntryProblem::WrongKey;
    if (info.problem == EntryProblem::Ok && verify_pages) {
      for (size_t i = 0; i < parsed.page_checksums.size() && info.problem == EntryProblem::Ok; ++i)
        if (!page_intact(file->bytes(), parsed, i)) info.problem = EntryProblem::PageChecksum;
      for (size_t j = 0; j < parsed.e_checksums.size() && info.problem == EntryProblem::Ok; ++j)
        if (!e_section_intact(file->bytes(), parsed, j)) info.problem = EntryProblem::ECacheChecksum;
    }
    if (info.problem == EntryProblem::Ok && auth_) {
      // Whether a MAC is there at all shows in the header; whether it is right takes every byte.
      if (parsed.mac_kind != kMacHmacSha256)
        info.problem = EntryProblem::MissingMac;
      else if (verify_pages)
        info.problem = check_entry_mac(file->bytes(), parsed, *auth_);
    }
    if (parsed.problem == EntryProblem::Ok) info.meta = std::move(parsed.meta);
    out.push_back(std::move(info));
  }
  if (ec) throw RuntimeFailure(fmt::format("cannot read the cache directory {}: {}", dir_, ec.message()));
  std::sort(out.begin(), out.end(), [](const EntryInfo& a, const EntryInfo& b) { return a.key < b.key; });
  return out;
}

size_t DiskStore::temp_files() const {
  size_t n = 0;
  std::error_code ec;
  for (const fs::directory_entry& de : fs::directory_iterator(dir_, ec))
    if (ends_with(de.path().filename().string(), kTempSuffix)) ++n;
  return n;
}

bool DiskStore::remove(uint64_t key) {
  require_marker();
  DirLock exclusive(dir_, LOCK_EX);
  const std::string path = entry_path(key);
  struct stat st;
  if (!is_regular(path, st)) {
    if (::lstat(path.c_str(), &st) == 0) report(path, kNotRegular);
    return false;
  }
  return ::unlink(path.c_str()) == 0;
}

size_t DiskStore::remove_all() {
  require_marker();
  DirLock exclusive(dir_, LOCK_EX);
  size_t removed = 0;
  std::error_code ec;
  std::vector<fs::path> paths;
  for (const fs::directory_entry& de : fs::directory_iterator(dir_, ec)) paths.push_back(de.path());
  for (const fs::path& p : paths) {
    std::string name = p.filename().string();
    struct stat st;
    if (entry_key_of(name)) {
      if (is_regular(p.string(), st))
        removed += ::unlink(p.c_str()) == 0;
      else if (::lstat(p.c_str(), &st) == 0)
        report(p.string(), kNotRegular);
    } else if (ends_with(name, kTempSuffix)) {
      remove_temp_if_abandoned(p.string());
    }
  }
  return removed;
}

GcReport DiskStore::gc(uint64_t max_bytes, std::chrono::seconds stale_temp_age) {
  require_marker();
  DirLock exclusive(dir_, LOCK_EX);
  GcReport report;
  const Clock::time_point now = Clock::now();
  std::error_code ec;
  std::vector<fs::path> temps;
  for (const fs::directory_entry& de : fs::directory_iterator(dir_, ec))
    if (ends_with(de.path().filename().string(), kTempSuffix)) temps.push_back(de.path());
  for (const fs::path& p : temps) {
    struct stat st;
    if (!is_regular(p.string(), st) || now - mtime_of(st) < stale_temp_age) continue;
    report.temp_files_removed += remove_temp_if_abandoned(p.string());
  }

  std::vector<EntryInfo> entries = list(false);
  std::vector<const EntryInfo*> usable;
  for (const EntryInfo& e : entries) {
    // Pages are not read here (that is `stat`'s job); a header that cannot be read is garbage to everyone.
    // A missing MAC is not: a reader without the key can still use the entry.
    bool unreadable = e.problem != EntryProblem::Ok && !depends_on_key(e.problem);
    if (unreadable && ::unlink(e.path.c_str()) == 0) {
      ++report.entries_removed;
      ++report.unusable_removed;
      report.bytes_removed += e.bytes;
    } else if (!unreadable) {
      usable.push_back(&e);
    }
  }
  std::sort(usable.begin(), usable.end(), [](const EntryInfo* a, const EntryInfo* b) {
    return a->last_use != b->last_use ? a->last_use < b->last_use : a->key < b->key;
  });
  uint64_t total = 0;
  for (const EntryInfo* e : usable) total += e->bytes;
  size_t next = 0;
  while (total > max_bytes && next < usable.size()) {
    const EntryInfo* e = usable[next++];
    if (::unlink(e->path.c_str()) == 0) {
      ++report.entries_removed;
      report.bytes_removed += e->bytes;
    }
    total -= e->bytes;
  }
  report.entries_kept = usable.size() - next;
  report.bytes_kept = total;
  return report;
}

}  // namespace choreo::store
