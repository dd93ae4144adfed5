// The keyed store (runtime/store/entry_auth.h, docs/store.md "Threat model"): key files are checked before
// use; with a key every entry written carries an HMAC-SHA256 and an entry without the right one is reported
// and treated as absent; without a key an entry forged with recomputed checksums is accepted (the documented
// limit of the unkeyed store), with a key it is rejected and the engine recomputes the right logits.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <random>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/store/disk_store.h"
#include "runtime/store/entry_auth.h"
#include "tests/cli_process.h"
#include "tests/runtime/store_test_util.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using store::EntryProblem;
using testing::computed_and_loaded;
using testing::ScopedEnv;
using testing::ScratchDir;
using testing::Warnings;

/// Writes `n` random bytes (seeded) to `path` with mode `mode`; returns the path.
std::string write_key(const fs::path& path, size_t n, unsigned seed, mode_t mode = 0600) {
  std::mt19937 rng(seed);
  std::string bytes;
  for (size_t i = 0; i < n; ++i) bytes.push_back(char(rng()));
  std::ofstream(path, std::ios::binary) << bytes;
  ::chmod(path.c_str(), mode);
  return path.string();
}

TEST_CASE(
    "store key: a key file is 32 to 4096 bytes that only its owner can access, anything else is refused") {
  ScratchDir dir;
  CHECK_NOTHROW(store::EntryAuthenticator::from_key_file(write_key(dir.path / "good", 32, 1)));
  CHECK_NOTHROW(store::EntryAuthenticator::from_key_file(write_key(dir.path / "long", 4096, 1, 0400)));
  CHECK(testing::input_error_text([&] {
          store::EntryAuthenticator::from_key_file(write_key(dir.path / "s", 31, 1));
        }).find("31 bytes") != std::string::npos);
  CHECK(testing::input_error_text([&] {
          store::EntryAuthenticator::from_key_file(write_key(dir.path / "l", 4097, 1));
        }).find("more than 4096") != std::string::npos);
  const std::string shared = write_key(dir.path / "shared", 32, 1, 0640);
  const std::string text = testing::input_error_text([&] { store::EntryAuthenticator::from_key_file(shared); });
  CHECK(text.find("group or others") != std::string::npos);
  CHECK(text.find("chmod 600") != std::string::npos);
  CHECK(testing::input_error_text([&] {
          store::EntryAuthenticator::from_key_file((dir.path / "none").string());
        }).find("cannot open") != std::string::npos);
  // A FIFO where the key should be is refused at once (opened without blocking), not waited on.
  const fs::path fifo = dir.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto refused = std::async(std::launch::async, [&] {
    return testing::input_error_text([&] { store::EntryAuthenticator::from_key_file(fifo.string()); });
  });
  REQUIRE(refused.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(refused.get().find("not a regular file") != std::string::npos);
}

TEST_CASE("store key: --store-key-file wins over $CHOREO_STORE_KEY_FILE, neither means an unkeyed store") {
  ScratchDir dir;
  const std::string a = write_key(dir.path / "a", 32, 1), b = write_key(dir.path / "b", 32, 2);
  const std::array<uint8_t, 4> bytes{1, 2, 3, 4};
  const std::span<const uint8_t> parts[] = {bytes};
  const store::Mac mac_a = store::EntryAuthenticator::from_key_file(a).mac(parts);
  const store::Mac mac_b = store::EntryAuthenticator::from_key_file(b).mac(parts);
  CHECK(mac_a != mac_b);
  {
    ScopedEnv env("CHOREO_STORE_KEY_FILE", nullptr);
    CHECK(!store::configured_authenticator());
    CHECK(store::configured_authenticator(a)->mac(parts) == mac_a);
  }
  {
    ScopedEnv env("CHOREO_STORE_KEY_FILE", b.c_str());
    CHECK(store::configured_authenticator()->mac(parts) == mac_b);
    CHECK(store::configured_authenticator(a)->mac(parts) == mac_a);
  }
}

TEST_CASE(
    "store key: a keyed store signs what it writes and rejects (reports, treats as absent) entries without "
    "its MAC, an unkeyed reader still reads signed entries") {
  ScratchDir dir, keys;
  const auto key = store::EntryAuthenticator::from_key_file(write_key(keys.path / "k", 32, 7));
  const auto other = store::EntryAuthenticator::from_key_file(write_key(keys.path / "o", 48, 8));
  const store::Compatibility compat{0xfeed, testing::small_layout()};
  testing::SyntheticEntry signed_entry = testing::synthetic_entry(0x1, 9, 0xfeed);
  testing::SyntheticEntry plain_entry = testing::synthetic_entry(0x2, 9, 0xfeed);
  testing::SyntheticEntry foreign_entry = testing::synthetic_entry(0x3, 9, 0xfeed);
  Warnings w;
  store::DiskStore keyed(dir.str(), true, w.sink(), key);
  store::DiskStore unkeyed(dir.str(), true, w.sink(), std::nullopt);
  store::DiskStore other_keyed(dir.str(), true, w.sink(), other);
  keyed.save(signed_entry.meta, signed_entry.page_pointers());
  unkeyed.save(plain_entry.meta, plain_entry.page_pointers());
  other_keyed.save(foreign_entry.meta, foreign_entry.page_pointers());

  const store::Opened m = keyed.open(0x1, compat);
  REQUIRE(m);
  CHECK(m.entry->parsed().mac_kind == store::kMacHmacSha256);
  CHECK(store::check_entry_mac(m.entry->bytes(), m.entry->parsed(), key) == EntryProblem::Ok);
  CHECK(store::check_entry_mac(m.entry->bytes(), m.entry->parsed(), other) == EntryProblem::BadMac);
  CHECK(w.lines.empty());

  CHECK(!keyed.open(0x2, compat));
  CHECK(w.any("no MAC"));
  CHECK(!keyed.open(0x3, compat));
  CHECK(w.any("MAC mismatch"));
  CHECK(w.lines.size() == 2);
  CHECK(unkeyed.open(0x1, compat));  // without a key, MACs are not checked (docs/store.md)
  CHECK(unkeyed.open(0x3, compat));

  // ls shows a missing MAC from the header alone, a wrong one once the pages are read (--verify, stat).
  std::vector<store::EntryInfo> quick = keyed.list(false), full = keyed.list(true);
  REQUIRE(quick.size() == 3);
  REQUIRE(full.size() == 3);
  CHECK(quick[0].problem == EntryProblem::Ok);
  CHECK(quick[1].problem == EntryProblem::MissingMac);
  CHECK(quick[2].problem == EntryProblem::Ok);
  CHECK(full[0].problem == EntryProblem::Ok);
  CHECK(full[1].problem == EntryProblem::MissingMac);
  CHECK(full[2].problem == EntryProblem::BadMac);
  // gc keeps them: another reader (without a key, or with the other one) can use them.
  CHECK(keyed.gc(uint64_t(1) << 40, std::chrono::hours(1)).entries_removed == 0);

  // Re-encoding under the key replaces the unsigned entry with a signed one.
  keyed.save(plain_entry.meta, plain_entry.page_pointers());
  CHECK(keyed.open(0x2, compat));
}

TEST_CASE(
    "store key: choreo encode --store-key-file signs its entries, stat and ls --verify under another key "
    "report them, and encode under that key recomputes and re-signs") {
  ScratchDir scratch;
  const fs::path store = scratch.path / "store", logs = scratch.path / "logs";
  fs::create_directories(logs);
  const std::string k1 = write_key(scratch.path / "k1", 32, 21), k2 = write_key(scratch.path / "k2", 64, 22);
  const fs::path schema = scratch.path / "s.pml";
  std::ofstream(schema) << "<schema name=\"keyed\">\n  Once upon a time there was a girl.\n  <union>\n"
                           "    <module name=\"a\">She saw a cat.</module>\n"
                           "    <module name=\"b\">She saw a dog.</module>\n  </union>\n</schema>\n";
  const std::string bin = testing::choreo_binary();
  auto encode = [&](const std::string& key) {
    return testing::run_process(
        bin,
        {"encode", schema.string(), "-m", testing::shared_file("models/stories260K.gguf"), "-t", "1",
         "--cache-dir", store.string(), "--store-key-file", key},
        logs);
  };
  auto cache = [&](std::vector<std::string> args, const std::string& key) {
    args.insert(args.end(), {"--cache-dir", store.string(), "--store-key-file", key});
    return testing::run_process(bin, args, logs);
  };
  testing::ProcessResult first = encode(k1);
  REQUIRE_MESSAGE(first.exit_code == 0, first.err);
  const int total = computed_and_loaded(first.out).first;
  REQUIRE(total > 0);
  const size_t entries = store::DiskStore(store.string(), false, {}, std::nullopt).list().size();
  REQUIRE(entries >= 2);

  testing::ProcessResult stat1 = cache({"cache", "stat"}, k1);
  CHECK(stat1.exit_code == 0);
  CHECK(stat1.out.find("rejected MAC:  0\n") != std::string::npos);
  testing::ProcessResult stat2 = cache({"cache", "stat"}, k2);
  CHECK(stat2.exit_code == 0);
  CHECK(stat2.out.find(fmt::format("rejected MAC:  {}\n", entries)) != std::string::npos);
  testing::ProcessResult ls2 = cache({"cache", "ls", "--verify"}, k2);
  CHECK(ls2.exit_code == 0);
  CHECK(ls2.out.find("MAC mismatch") != std::string::npos);
  CHECK(ls2.out.find(" ok ") == std::string::npos);

  testing::ProcessResult second = encode(k2);
  REQUIRE_MESSAGE(second.exit_code == 0, second.err);
  CHECK(computed_and_loaded(second.out) == std::pair<int, int>(total, 0));
  CHECK(second.err.find("MAC mismatch") != std::string::npos);
  testing::ProcessResult third = encode(k2);
  CHECK(computed_and_loaded(third.out) == std::pair<int, int>(0, total));
  CHECK(third.err.find("warning") == std::string::npos);

  ::chmod(k2.c_str(), 0644);
  testing::ProcessResult open_key = encode(k2);
  CHECK(open_key.exit_code == 2);
  CHECK(open_key.err.find("chmod 600") != std::string::npos);
}

// ---- forgery: two real entries with their pages swapped and every unkeyed checksum recomputed ----------

constexpr int kPageTokens = 8;

std::vector<model::Token> text(const std::string& s) {
  return testing::stories260k().model->vocab().tokenize(s, false);
}

/// Two root messages with the same number of tokens (hence pages).
std::pair<std::vector<model::Token>, std::vector<model::Token>> twin_texts() {
  std::vector<model::Token> x = text("Once upon a time there was a little cat named Tom who liked the sun.");
  std::vector<model::Token> y = text("One day a big brown dog ran to the park to play with his red ball.");
  const size_t n = std::min(x.size(), y.size());
  x.resize(n);
  y.resize(n);
  return {x, y};
}

/// Prefills the twin messages in an engine that persists every prefill to `disk`; returns their keys.
std::pair<uint64_t, uint64_t> write_twins(store::DiskStore& disk, const std::vector<model::Token>& x,
                                          const std::vector<model::Token>& y) {
  kv::PagePool pool(testing::stories260k().model->backend(), testing::stories260k().model->kv_layout(kPageTokens), size_t(64) << 20);
  runtime::Engine writer(*testing::stories260k().model, pool);
  writer.set_disk_store(&disk, /*persist_prefills=*/true);
  const uint64_t key_x = writer.store().get(writer.prefill({x, {}, {}, "", {}}).id).key;
  const uint64_t key_y = writer.store().get(writer.prefill({y, {}, {}, "", {}}).id).key;
  return {key_x, key_y};
}

/// Greedy logits of 8 tokens decoded over the message with these tokens (prefilled, or loaded from `disk`).
struct Decoded {
  bool loaded = false;
  std::vector<std::vector<float>> logits;
};
Decoded decode_over(const std::vector<model::Token>& tokens, store::DiskStore* disk) {
  kv::PagePool pool(testing::stories260k().model->backend(), testing::stories260k().model->kv_layout(kPageTokens), size_t(64) << 20);
  runtime::Engine engine(*testing::stories260k().model, pool);
  if (disk) engine.set_disk_store(disk);
  runtime::PrefillResult p = engine.prefill({tokens, {}, {}, "", {}});
  runtime::DecodeRequest d;
  d.header = text(" Then");
  d.parents = {{p.id, {}, {}}};
  d.sampling.temperature = 0;
  d.exact_tokens = 8;
  d.record_logits = true;
  return {p.loaded, engine.decode(d).logits};
}

/// Rewrites the entry at `path` with the pages of the entry at `donor` (same page count): new XXH3 page
/// checksums and header checksum, so that every unkeyed check passes. The forger has no key: a MAC field is
/// copied as it was.
void forge_pages(const std::string& path, const std::string& donor) {
  const std::string victim_bytes = testing::read_file(path), donor_bytes = testing::read_file(donor);
  const std::span<const uint8_t> victim(reinterpret_cast<const uint8_t*>(victim_bytes.data()),
                                        victim_bytes.size());
  const std::span<const uint8_t> pages_from(reinterpret_cast<const uint8_t*>(donor_bytes.data()),
                                            donor_bytes.size());
  store::ParsedEntry v = store::parse_entry(victim), d = store::parse_entry(pages_from);
  REQUIRE(v.problem == EntryProblem::Ok);
  REQUIRE(d.problem == EntryProblem::Ok);
  REQUIRE(v.meta.n_pages() == d.meta.n_pages());
  const std::span<const uint8_t> pages = pages_from.subspan(d.pages_offset);
  std::vector<uint64_t> sums;
  const size_t page_bytes = v.meta.page_bytes();
  for (size_t i = 0; i < v.meta.n_pages(); ++i)
    sums.push_back(XXH3_64bits(pages.data() + i * page_bytes, page_bytes));
  std::vector<uint8_t> forged = store::encode_header(v.meta, sums, v.mac_kind);
  std::memcpy(forged.data() + v.mac_offset, v.mac.data(), v.mac.size());
  forged.insert(forged.end(), pages.begin(), pages.end());
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(forged.data()), std::streamsize(forged.size()));
  // Every unkeyed check passes on the forgery.
  store::ParsedEntry f = store::parse_entry(forged);
  REQUIRE(f.problem == EntryProblem::Ok);
  for (size_t i = 0; i < f.meta.n_pages(); ++i) REQUIRE(store::page_intact(forged, f, i));
}

TEST_SUITE("hostile") {
  TEST_CASE(
      "store forgery: swapped pages with recomputed checksums pass an unkeyed store (its known limit) and "
      "are "
      "rejected by a keyed one, whose engine recomputes the right logits") {
    const auto [x, y] = twin_texts();
    REQUIRE(x.size() > size_t(kPageTokens));  // several pages
    const Decoded fresh = decode_over(x, nullptr);
    REQUIRE(fresh.logits.size() == 8);
    ScratchDir dir, keys;
    const std::string key_file = write_key(keys.path / "key", 32, 11);
    for (bool keyed : {false, true}) {
      CAPTURE(keyed);
      Warnings w;
      store::DiskStore disk(
          dir.str(), true, w.sink(),
          keyed ? std::optional(store::EntryAuthenticator::from_key_file(key_file)) : std::nullopt);
      disk.remove_all();
      const auto [key_x, key_y] = write_twins(disk, x, y);
      const Decoded honest = decode_over(x, &disk);
      CHECK(honest.loaded);
      CHECK(honest.logits == fresh.logits);

      forge_pages(disk.entry_path(key_x), disk.entry_path(key_y));
      const Decoded after = decode_over(x, &disk);
      if (!keyed) {
        CHECK(after.loaded);                  // accepted: nothing unkeyed can tell
        CHECK(after.logits != fresh.logits);  // and it changes what the model says
        CHECK(w.lines.empty());
      } else {
        CHECK_FALSE(after.loaded);            // rejected ...
        CHECK(after.logits == fresh.logits);  // ... and recomputed, exactly
        CHECK(w.any("MAC mismatch"));
        std::vector<store::EntryInfo> listed = disk.list(true);
        REQUIRE(listed.size() == 2);
        CHECK(listed[key_x < key_y ? 0 : 1].problem == EntryProblem::BadMac);
        CHECK(listed[key_x < key_y ? 1 : 0].problem == EntryProblem::Ok);
      }
    }
  }

  TEST_CASE("store forgery: a keyed store rejects a forgery written without a MAC") {
    const auto [x, y] = twin_texts();
    const Decoded fresh = decode_over(x, nullptr);
    ScratchDir dir, keys;
    const auto key = store::EntryAuthenticator::from_key_file(write_key(keys.path / "key", 32, 12));
    Warnings w;
    store::DiskStore keyed(dir.str(), true, w.sink(), key);
    store::DiskStore forger(dir.str(), true, w.sink(), std::nullopt);  // writes well-formed unsigned entries
    const auto [key_x, key_y] = write_twins(forger, x, y);
    forge_pages(forger.entry_path(key_x), forger.entry_path(key_y));
    const Decoded after = decode_over(x, &keyed);
    CHECK_FALSE(after.loaded);
    CHECK(after.logits == fresh.logits);
    CHECK(w.any("no MAC"));
  }
}

}  // namespace
}  // namespace choreo
