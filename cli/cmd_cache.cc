// `choreo cache ls|stat|rm|gc`: inspect and manage the persistent encoding store (docs/store.md).

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "runtime/kv/tier_config.h"
#include "runtime/store/redis_store.h"
#include "runtime/store/cache_dir.h"
#include "runtime/store/disk_store.h"

namespace choreo::cli {

namespace {

struct CacheOptions {
  std::string cache_dir;
  std::string key_file;
  bool verify = false;
  std::vector<std::string> keys;
  bool all = false;
  double max_mib = -1;
  double stale_minutes = 60;
};

std::string human_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < (uint64_t(1) << 20)) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < (uint64_t(1) << 30)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
}

std::string local_time(store::Clock::time_point t) {
  std::time_t seconds = store::Clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &tm);
  return text;
}

/// The store directory, or nullopt (with a note) when it does not exist yet: nothing was ever stored there.
/// Opening never writes. With `for_removal` (rm, gc), the directory must carry the store's marker, and no key
/// is needed (they delete by name and header, never by MAC).
std::optional<store::DiskStore> open_existing(const CacheOptions& o, bool for_removal = false) {
  std::string dir = store::resolve_cache_dir(o.cache_dir);
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::fprintf(stderr, "note: the store %s does not exist yet (nothing has been persisted there)\n",
                 dir.c_str());
    return std::nullopt;
  }
  store::DiskStore disk(dir, false, {},
                        for_removal ? std::nullopt : store::configured_authenticator(o.key_file));
  if (for_removal) disk.require_marker();
  return disk;
}

/// A note for ls and stat on a directory that is not (yet) a marked store: they only read, so they go on.
void note_unmarked(const store::DiskStore& disk) {
  if (!disk.marked())
    std::fprintf(stderr,
                 "note: %s has no %s marker: it is not a store choreo created (cache rm and gc refuse it)\n",
                 disk.dir().c_str(), std::string(store::kMarkerName).c_str());
}

std::string model_label(const store::EntryInfo& e) {
  if (e.problem != store::EntryProblem::Ok && e.meta.model_fingerprint == 0) return "?";
  std::string label = fmt::format("{} {}", store::key_hex(e.meta.model_fingerprint), e.meta.model_name);
  if (!e.meta.e_layers.empty()) label += fmt::format(" (E caches at layers {})", fmt::join(e.meta.e_layers, ","));
  return label;
}

void run_ls(const CacheOptions& o) {
  std::optional<store::DiskStore> disk = open_existing(o);
  if (!disk) return;
  note_unmarked(*disk);
  std::printf("%-16s  %-8s  %10s  %-19s  %-16s  %-6s  %s\n", "key", "tokens", "bytes", "last use", "tag",
              "status", "model");
  for (const store::EntryInfo& e : disk->list(o.verify)) {
    bool ok = e.problem == store::EntryProblem::Ok;
    std::printf("%-16s  %-8s  %10s  %-19s  %-16s  %-6s  %s\n", store::key_hex(e.key).c_str(),
                ok ? std::to_string(e.meta.tokens.size()).c_str() : "-", human_bytes(e.bytes).c_str(),
                local_time(e.last_use).c_str(), ok && e.meta.tag ? store::key_hex(e.meta.tag).c_str() : "-",
                ok ? "ok" : "BAD",
                ok ? model_label(e).c_str() : std::string(store::describe(e.problem)).c_str());
  }
}

/// The tiers as choreo.toml (or the defaults) sets them; T3's server is asked what it holds.
void print_tiers() {
  EngineFlags t;
  t.resolve();
  const std::string path = kv::tier_config_path();
  std::error_code ec;
  std::printf("tiers:         %s\n",
              std::filesystem::exists(path, ec) ? ("as " + path + " sets them").c_str()
                                                : ("defaults (no " + path + ")").c_str());
  std::printf("  T0 (pool):   %d MiB per engine (--cache-mib), eviction policy %s (--evict)\n", t.cache_mib,
              t.evict.c_str());
  std::printf("  T1 (host):   %s\n",
              t.host_cache_mib ? fmt::format("{} MiB (--host-cache-mib)", t.host_cache_mib).c_str()
                               : "none (--host-cache-mib)");
  std::printf("  T2 (store):  the store below; evictions write %s\n",
              t.disk_cache_mib ? fmt::format("up to {} MiB to it (--disk-cache-mib)", t.disk_cache_mib).c_str()
                               : "nothing to it (--disk-cache-mib 0)");
  if (t.redis.empty()) {
    std::printf("  T3 (Redis):  none (--redis)\n");
    return;
  }
  std::string what;
  try {
    store::RedisStore redis(*t.engine_options(runtime::Mode::Choreo, StorePolicy::None).stores.redis);
    if (auto u = redis.usage())
      what = fmt::format("{} encodings, {}", u->first, human_bytes(u->second));
    else
      what = "stopped answering";
  } catch (const InputError& e) {
    what = e.message();
  }
  std::printf("  T3 (Redis):  %s: %s\n", t.redis.c_str(), what.c_str());
}

void run_stat(const CacheOptions& o) {
  print_tiers();
  std::optional<store::DiskStore> disk = open_existing(o);
  if (!disk) return;
  note_unmarked(*disk);
  struct Totals {
    size_t entries = 0;
    uint64_t bytes = 0, tokens = 0;
  };
  Totals all;
  std::map<std::string, Totals> per_model;
  std::vector<const store::EntryInfo*> bad, unauthenticated;
  std::vector<store::EntryInfo> entries = disk->list(true);  // stat reads every page to check it
  for (const store::EntryInfo& e : entries) {
    ++all.entries;
    all.bytes += e.bytes;
    if (e.problem != store::EntryProblem::Ok) {
      (store::depends_on_key(e.problem) ? unauthenticated : bad).push_back(&e);
      continue;
    }
    Totals& t = per_model[model_label(e)];
    ++t.entries;
    t.bytes += e.bytes;
    t.tokens += e.meta.tokens.size();
  }
  std::printf("store:         %s\n", disk->dir().c_str());
  std::printf("entries:       %zu (%s)\n", all.entries, human_bytes(all.bytes).c_str());
  std::printf("key:           %s\n", disk->keyed()
                                         ? "HMAC-SHA256 (entries without the right MAC are rejected)"
                                         : "none (unkeyed checksums only; docs/store.md)");
  std::printf("corrupt:       %zu\n", bad.size());
  if (disk->keyed()) std::printf("rejected MAC:  %zu\n", unauthenticated.size());
  std::printf("temp files:    %zu\n", disk->temp_files());
  for (const auto& [model, t] : per_model)
    std::printf("model %s: %zu entries, %llu tokens, %s\n", model.c_str(), t.entries,
                (unsigned long long)t.tokens, human_bytes(t.bytes).c_str());
  for (const store::EntryInfo* e : bad)
    std::printf("corrupt %s: %s\n", store::key_hex(e->key).c_str(),
                std::string(store::describe(e->problem)).c_str());
  for (const store::EntryInfo* e : unauthenticated)
    std::printf("rejected %s: %s\n", store::key_hex(e->key).c_str(),
                std::string(store::describe(e->problem)).c_str());
}

/// A key given on the command line: 16 hex digits, or a prefix of at least 4 that names exactly one entry.
uint64_t resolve_key(const std::string& text, const std::vector<store::EntryInfo>& entries) {
  bool hex = !text.empty() && text.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  if (!hex || text.size() < 4 || text.size() > 16)
    throw InputError(fmt::format("'{}' is not an entry key", text),
                     "give the 16 hex digits `choreo cache ls` prints (or a unique prefix of at least 4)");
  std::string lower = text;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::vector<uint64_t> matches;
  for (const store::EntryInfo& e : entries)
    if (store::key_hex(e.key).starts_with(lower)) matches.push_back(e.key);
  if (matches.empty())
    throw InputError(fmt::format("no store entry has key '{}'", text), "see `choreo cache ls`");
  if (matches.size() > 1)
    throw InputError(fmt::format("key prefix '{}' names {} entries", text, matches.size()),
                     "give more digits");
  return matches.front();
}

void run_rm(const CacheOptions& o) {
  if (o.all == !o.keys.empty())
    throw InputError(o.all ? "cache rm: give either keys or --all, not both" : "cache rm: nothing to remove",
                     "choreo cache rm KEY... or choreo cache rm --all");
  std::optional<store::DiskStore> disk = open_existing(o, true);
  if (o.all) {
    size_t n = disk ? disk->remove_all() : 0;
    std::printf("removed %zu entries\n", n);
    return;
  }
  std::vector<store::EntryInfo> entries = disk ? disk->list(false) : std::vector<store::EntryInfo>{};
  std::vector<uint64_t> keys;
  for (const std::string& k : o.keys)
    keys.push_back(resolve_key(k, entries));  // all checked before any removal
  size_t n = 0;
  for (uint64_t k : keys) n += disk->remove(k);
  std::printf("removed %zu entries\n", n);
}

void run_gc(const CacheOptions& o) {
  if (!(o.max_mib >= 0)) throw InputError("cache gc: --max-mib must be a number >= 0", "e.g. --max-mib 2048");
  if (!(o.stale_minutes >= 0)) throw InputError("cache gc: --stale-minutes must be a number >= 0");
  std::optional<store::DiskStore> disk = open_existing(o, true);
  if (!disk) return;
  store::GcReport r =
      disk->gc(uint64_t(o.max_mib * 1048576.0), std::chrono::seconds(int64_t(o.stale_minutes * 60)));
  std::printf("removed %zu entries (%s; %zu unreadable) and %zu stale temp files; kept %zu entries (%s)\n",
              r.entries_removed, human_bytes(r.bytes_removed).c_str(), r.unusable_removed,
              r.temp_files_removed, r.entries_kept, human_bytes(r.bytes_kept).c_str());
}

void add_dir_option(CLI::App* cmd, CacheOptions& o) {
  cmd->add_option("--cache-dir", o.cache_dir,
                  "store directory (default: $CHOREO_CACHE_DIR, else $XDG_CACHE_HOME/choreo/store, else "
                  "~/.cache/choreo/store)");
}

void add_key_option(CLI::App* cmd, CacheOptions& o) {
  cmd->add_option("--store-key-file", o.key_file,
                  "check entries' MACs with the store key in this file (default: $CHOREO_STORE_KEY_FILE; "
                  "docs/store.md)");
}

}  // namespace

void register_cache(CLI::App& app) {
  auto o = std::make_shared<CacheOptions>();
  CLI::App* cache = app.add_subcommand("cache", "inspect and manage the persistent encoding store");
  cache->require_subcommand(1);

  CLI::App* ls = cache->add_subcommand("ls", "list entries: key, tokens, bytes, last use, tag, model");
  add_dir_option(ls, *o);
  add_key_option(ls, *o);
  ls->add_flag("--verify", o->verify, "also read every page and check its checksum (and its MAC when keyed)");
  ls->callback([o] { run_ls(*o); });

  CLI::App* stat = cache->add_subcommand("stat", "entry count, bytes, per-model breakdown, corrupt entries");
  add_dir_option(stat, *o);
  add_key_option(stat, *o);
  stat->callback([o] { run_stat(*o); });

  CLI::App* rm = cache->add_subcommand("rm", "remove entries by key, or all of them");
  add_dir_option(rm, *o);
  rm->add_option("keys", o->keys, "entry keys (16 hex digits, or a unique prefix of at least 4)");
  rm->add_flag("--all", o->all, "remove every entry");
  rm->callback([o] { run_rm(*o); });

  CLI::App* gc = cache->add_subcommand("gc", "evict least-recently-used entries down to a size budget");
  add_dir_option(gc, *o);
  gc->add_option("--max-mib", o->max_mib, "size budget of the entries in MiB")->required();
  gc->add_option("--stale-minutes", o->stale_minutes,
                 "also remove temporary files left by crashed writers when older than this (default 60)");
  gc->callback([o] { run_gc(*o); });
}

}  // namespace choreo::cli
