#pragma once
// T2 and T3 behind one interface (DESIGN.md §3, docs/store.md "Tiers"). The tier manager
// (runtime/engine/tiers.h) holds an ordered list of EntryStores, fastest first, and opens, reads, writes and
// reports through it without knowing which kind each one is: DiskStore (T2, files in a directory) and
// RedisStore (T3, values in a Redis server) implement it. An entry crosses the interface as its bytes (a
// mapped file, a value read) with its parsed and checked header; its pages go to the backend by page id
// (read_entry), never through the page pool's page lists.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.h"
#include "runtime/store/entry_format.h"

namespace choreo::store {

/// Receives one warning line (without a trailing newline).
using WarningSink = std::function<void(const std::string&)>;

/// What an entry must match to be used by a given engine.
struct Compatibility {
  uint64_t model_fingerprint = 0;
  kernels::KvLayout layout;
};

/// Why an entry whose header parsed cannot serve `key` for `expect`: WrongKey, WrongModel, WrongLayout, or Ok.
/// The same rule for every place entries come from (a store file, a Redis value).
EntryProblem compatibility_problem(const EntryMeta& meta, uint64_t key, const Compatibility& expect);

/// Parses an entry's bytes (parse_entry) and checks that they can serve `key` for `expect`
/// (compatibility_problem): `problem` is Ok, or what is wrong. Pages are not checked.
ParsedEntry parse_entry_for(std::span<const uint8_t> entry, uint64_t key, const Compatibility& expect);

/// Parses, checks (parse_entry_for) and, when `auth` is given, authenticates an entry's bytes
/// (check_entry_mac, which reads every byte): the first problem found, or Ok.
ParsedEntry check_entry(std::span<const uint8_t> entry, uint64_t key, const Compatibility& expect,
                        const EntryAuthenticator* auth);

/// Where page `i` of a parsed entry's bytes starts.
const std::byte* entry_page(std::span<const uint8_t> entry, const ParsedEntry& parsed, size_t i);

/// The E-cache sections of a checked entry (body_damage found nothing) for those of `layers` it holds:
/// layer -> every token's row of meta.e_dim floats.
std::map<int, std::vector<float>> e_sections(std::span<const uint8_t> entry, const ParsedEntry& parsed,
                                             std::span<const int> layers);

/// An entry from a store whose header passed every check (and its MAC, when the store is keyed). Its pages
/// and E caches are checked when they are read (read_entry).
class StoredEntry {
 public:
  virtual ~StoredEntry() = default;
  /// The whole entry: header, pages, E caches.
  virtual std::span<const uint8_t> bytes() const = 0;
  const ParsedEntry& parsed() const { return parsed_; }
  const EntryMeta& meta() const { return parsed_.meta; }

 protected:
  explicit StoredEntry(ParsedEntry parsed) : parsed_(std::move(parsed)) {}

 private:
  ParsedEntry parsed_;
};

/// An entry held in memory (a value read from a server, or bytes a test made).
class BufferedEntry final : public StoredEntry {
 public:
  BufferedEntry(std::vector<uint8_t> bytes, ParsedEntry parsed)
      : StoredEntry(std::move(parsed)), bytes_(std::move(bytes)) {}
  std::span<const uint8_t> bytes() const override { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

/// What looking for an entry found: the entry, nothing, or something that failed its checks (reported by the
/// store, once).
struct Opened {
  std::unique_ptr<StoredEntry> entry;
  bool bad = false;
  explicit operator bool() const { return entry != nullptr; }
};

/// An open begun on the store's own thread and finished on another (a prefetch's background job). The store
/// does on its thread what must be done there (the disk store: open the file and check its header); the rest
/// (a server's reply) happens in finish(), which may run on any thread, once.
class PendingEntry {
 public:
  virtual ~PendingEntry() = default;
  /// The entry; or no entry with `bad` unset (it was not there: the server may have evicted it) or set, with
  /// what was wrong in `problem` (not reported yet: report it on the store's thread with report_bad).
  virtual Opened finish(std::string& problem) = 0;
};

/// An open that is complete already: finish() hands over what it found.
class ReadyEntry final : public PendingEntry {
 public:
  explicit ReadyEntry(Opened opened) : opened_(std::move(opened)) {}
  Opened finish(std::string&) override { return std::move(opened_); }

 private:
  Opened opened_;
};

/// One tier of persistent or shared encodings below host memory.
class EntryStore {
 public:
  virtual ~EntryStore() = default;
  /// The tier it is (2: a directory on disk, 3: a shared server): what the tier statistics count it under.
  virtual int tier() const = 0;
  /// Where it is, for messages: a directory, or host:port.
  virtual std::string where() const = 0;
  /// False once the store stopped working (a server that went away); every later call misses.
  virtual bool usable() const { return true; }
  /// True when entries are signed and checked with a store key (entry_auth.h).
  virtual bool keyed() const = 0;

  /// The entry under `key` when it is there and usable for `expect`. An entry that is there but unusable
  /// (damaged, another model's, unsigned or forged when the store is keyed) is reported once and `bad`.
  virtual Opened open(uint64_t key, const Compatibility& expect) = 0;
  /// Begins an open for another thread to finish (PendingEntry). Null when it is certain now that no usable
  /// entry is there (a bad one is reported, and `bad` set when given).
  virtual std::unique_ptr<PendingEntry> begin_open(uint64_t key, const Compatibility& expect, bool* bad) = 0;
  /// True when something is stored under `key` (its content is not read).
  virtual bool holds(uint64_t key) const = 0;

  /// Writes one entry, replacing any with the same key (signed when the store is keyed): meta.n_pages() pages
  /// of meta.page_bytes() bytes, then one E-cache section of meta.e_section_bytes() per meta.e_layers. Returns
  /// the bytes the store now holds for it, or nullopt when it cannot take the entry (reported). Throws
  /// RuntimeFailure on an I/O error that should stop further writes (nothing partial becomes visible).
  virtual std::optional<uint64_t> save(const EntryMeta& meta, std::span<const std::byte* const> pages,
                                       std::span<const std::span<const uint8_t>> e_sections) = 0;

  /// Reports (once per entry) that the entry under `key` cannot be used, for reasons only the caller can see.
  virtual void report_bad(uint64_t key, std::string_view what) = 0;
  /// Records a use of the entry (the order the store's own eviction follows); nothing by default.
  virtual void touch(uint64_t /*key*/) {}
};

/// The one path by which stored pages reach T0, for the synchronous and the prefetching load alike: checks
/// every page and E-cache section of `entry` against its checksum, then copies its pages into `pages` (as
/// many as the entry has) on `backend` (one batched copy, waited for) and the E caches of `e_layers` it holds into `e_cache`. Returns what
/// was wrong (nothing is copied then), or nullopt. Safe on any thread for pages no one else writes.
std::optional<std::string> read_entry(const StoredEntry& entry, std::span<const kernels::PageId> pages,
                                      kernels::Backend& backend, std::span<const int> e_layers,
                                      std::map<int, std::vector<float>>& e_cache);

}  // namespace choreo::store
