#pragma once
// The persistent encoding store (DESIGN.md §3, tier T2; docs/store.md): one file per encoded message, named
// by its content key, in one directory that several choreo processes may share.
//  - Writes are crash-safe: a temporary file in the same directory (flock'ed while it is written), fsync,
//    rename onto `<key>.ckv`, fsync of the directory. Readers only ever open `*.ckv` names, so they never see
//    a partial file.
//  - Reads mmap the file and check everything (magic, format version, sizes, header and page checksums, key,
//    model fingerprint, KV layout). An unusable file is reported once (a warning) and treated as absent.
//  - Last use is the file's mtime: set when written and on every load (entries are never modified in place,
//    so nothing else changes it). `gc` evicts least-recently-used entries down to a byte budget.
//  - `gc` and `rm` hold an exclusive flock on `<dir>/lock`; a writer holds it shared while it creates (and
//    locks) its temp file and around its rename, so gc never mistakes a starting write for a dead one.
//  - The directory carries the marker file `CHOREO_STORE`. A writer creates it (or adopts a directory that
//    holds nothing but store-named files); `gc` and `rm` refuse a directory without it.
//  - Only regular files are ever opened: anything else at a store name (FIFO, symlink, directory, device)
//    is reported and skipped, never opened through and never followed.
//  - With a store key (entry_auth.h), every entry written carries a MAC and an entry without the right one
//    is treated as absent.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "runtime/store/entry_auth.h"
#include "runtime/store/entry_format.h"
#include "runtime/store/entry_store.h"
#include "runtime/store/mapped_file.h"
#include "runtime/store/store_marker.h"

namespace choreo::store {

using Clock = std::chrono::system_clock;

/// An entry mapped from disk whose header passed every check; pages are checked as they are read
/// (read_entry).
class MappedEntry final : public StoredEntry {
 public:
  MappedEntry(MappedFile file, ParsedEntry parsed) : StoredEntry(std::move(parsed)), file_(std::move(file)) {}
  std::span<const uint8_t> bytes() const override { return file_.bytes(); }

 private:
  MappedFile file_;
};

/// Test hooks of a write.
struct SaveOptions {
  std::function<void(size_t page_index)> after_page;  // called after each page is written (before fsync)
};

/// One `*.ckv` file as `ls` shows it.
struct EntryInfo {
  uint64_t key = 0;  // from the file name
  std::string path;
  uint64_t bytes = 0;
  Clock::time_point last_use;
  // Header problems (and MissingMac when the store is keyed); page and MAC problems too when pages were
  // verified.
  EntryProblem problem = EntryProblem::Ok;
  EntryMeta meta;  // valid when the header is intact
};

/// What a gc pass did.
struct GcReport {
  size_t entries_removed = 0;
  uint64_t bytes_removed = 0;
  size_t unusable_removed = 0;  // entries whose header was unreadable (included in entries_removed)
  size_t temp_files_removed = 0;
  size_t entries_kept = 0;
  uint64_t bytes_kept = 0;
};

/// One store directory: T2 of the KV tiers.
class DiskStore final : public EntryStore {
 public:
  /// Opens `dir`. With `create`, the store is made ready for writing now: the directory is created (mode
  /// 0700) when missing, and marked (adopted) when it exists without the marker but holds only store-named
  /// files. Throws InputError when `dir` is not a usable directory, or (with `create`) when it holds other
  /// files and no marker. `auth`, when set, signs every entry written and is required of every entry read.
  explicit DiskStore(std::string dir, bool create = true, WarningSink warn = {},
                     std::optional<EntryAuthenticator> auth = configured_authenticator());

  const std::string& dir() const { return dir_; }
  std::string entry_path(uint64_t key) const;
  /// True when entries are signed and checked with a store key.
  bool keyed() const override { return auth_.has_value(); }
  /// True when the directory carries a valid marker file.
  bool marked() const;
  /// Throws InputError (with a hint) unless the directory carries a valid marker file.
  void require_marker() const;
  /// Entries this object has written (renamed into place).
  size_t entries_written() const { return entries_written_; }

  /// Writes one entry crash-safely, replacing any entry with the same key. `pages` hold meta.n_pages() pages
  /// of meta.page_bytes() bytes, `e_sections` one section of meta.e_section_bytes() per meta.e_layers. Marks
  /// the directory first if needed (see the constructor). Returns false, with a warning, when the entry's
  /// name is held by a directory, which a rename cannot replace (whatever else sits at the name is replaced:
  /// a rename never follows a link). Throws RuntimeFailure on I/O errors (nothing partial becomes visible),
  /// InputError when the directory is not a store and cannot be adopted.
  bool save(const EntryMeta& meta, std::span<const std::byte* const> pages,
            std::span<const std::span<const uint8_t>> e_sections, const SaveOptions& options);

  /// True when a regular file sits at the entry's name (its content is not read).
  bool has_file(uint64_t key) const;

  /// Reports (once per file) that the entry with this key cannot be used, for reasons only the caller can
  /// see.
  void report_unusable(uint64_t key, std::string_view what) { report(entry_path(key), what); }

  // ---- EntryStore ----
  int tier() const override { return 2; }
  std::string where() const override { return dir_; }
  /// The entry with this key when it exists, is a regular file, its header is intact and matches `expect`,
  /// and (when keyed) its MAC is right; otherwise none (an existing but unusable file is reported once, and
  /// `bad`).
  Opened open(uint64_t key, const Compatibility& expect) override;
  /// Opens the entry now (open): what is left for another thread is reading its pages.
  std::unique_ptr<PendingEntry> begin_open(uint64_t key, const Compatibility& expect, bool* bad) override;
  bool holds(uint64_t key) const override { return has_file(key); }
  /// The entry's file size; see save() above for the rest.
  std::optional<uint64_t> save(const EntryMeta& meta, std::span<const std::byte* const> pages,
                               std::span<const std::span<const uint8_t>> e_sections = {}) override;
  void report_bad(uint64_t key, std::string_view what) override { report_unusable(key, what); }
  void touch(uint64_t key) override { touch(key, std::nullopt); }

  /// Records a use now (or at `when`): the LRU order of gc.
  void touch(uint64_t key, std::optional<Clock::time_point> when);

  /// Every entry file that is a regular file (sorted by key; anything else at an entry name is reported and
  /// skipped). With `verify_pages`, reads every page to check its checksum, and its MAC when keyed.
  std::vector<EntryInfo> list(bool verify_pages = false) const;
  /// Number of temporary files (writes in progress or left by a crash).
  size_t temp_files() const;
  /// Removes one entry; false when there was none. Throws InputError when the directory has no marker.
  bool remove(uint64_t key);
  /// Removes every entry and every temporary file no process is writing; returns the entries removed.
  /// Throws InputError when the directory has no marker.
  size_t remove_all();
  /// Removes unreadable entries, temporary files older than `stale_temp_age` that no live process holds, and
  /// least-recently-used entries until the entries total at most `max_bytes`. Throws InputError when the
  /// directory has no marker.
  GcReport gc(uint64_t max_bytes, std::chrono::seconds stale_temp_age);

 private:
  void report(const std::string& path, std::string_view what) const;
  void claim();  // marks the directory (or throws) unless done already

  std::string dir_;
  WarningSink warn_;
  std::optional<EntryAuthenticator> auth_;
  bool claimed_ = false;
  size_t entries_written_ = 0;
  mutable std::set<std::string> warned_;  // files already reported by this process
};

/// Formats a key as the 16 hex digits used in file names.
std::string key_hex(uint64_t key);
/// Parses 16 hex digits; nullopt otherwise.
std::optional<uint64_t> parse_key_hex(std::string_view text);

}  // namespace choreo::store
