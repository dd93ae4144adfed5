// The store's entry format (runtime/store/entry_format.h): what is written parses back identically, and no
// damage to the checked bytes — a flipped byte, a truncation, trailing bytes, another version — goes
// unnoticed.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include "runtime/store/cache_dir.h"
#include "runtime/store/disk_store.h"
#include "runtime/store/entry_format.h"
#include "tests/runtime/store_test_util.h"

namespace choreo {
namespace {

using store::EntryProblem;

/// The whole file of a synthetic entry: encoded header, then the pages' bytes.
std::vector<uint8_t> file_bytes(const testing::SyntheticEntry& e) {
  const size_t page_bytes = e.meta.page_bytes();
  std::vector<uint64_t> sums;
  for (const auto& page : e.pages) sums.push_back(XXH3_64bits(page.data(), page_bytes));
  std::vector<uint8_t> file = store::encode_header(e.meta, sums);
  for (const auto& page : e.pages) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(page.data());
    file.insert(file.end(), p, p + page_bytes);
  }
  return file;
}

using testing::ScopedEnv;

TEST_CASE("store format: an encoded entry parses back to the same metadata, pages and checksums") {
  testing::SyntheticEntry e = testing::synthetic_entry(0x1234abcd5678ef01ull, 10, 77);  // 3 pages of 4 tokens
  std::vector<uint8_t> file = file_bytes(e);
  REQUIRE(file.size() == store::header_bytes(e.meta) + 3 * e.meta.page_bytes());
  CHECK(store::header_bytes(e.meta) % 64 == 0);
  store::ParsedEntry parsed = store::parse_entry(file);
  REQUIRE(parsed.problem == EntryProblem::Ok);
  const store::EntryMeta& m = parsed.meta;
  CHECK(m.model_fingerprint == 77);
  CHECK(m.content_key == e.meta.content_key);
  CHECK(m.tag == e.meta.tag);
  CHECK(m.tokens == e.meta.tokens);
  CHECK(m.start_pos == e.meta.start_pos);
  CHECK(m.parents == e.meta.parents);
  CHECK(m.agent == e.meta.agent);
  CHECK(m.model_name == e.meta.model_name);
  CHECK(m.layout.page_tokens == 4);
  CHECK(m.layout.n_layers == 2);
  CHECK(m.layout.n_kv_heads == 2);
  CHECK(m.layout.head_dim == 4);
  REQUIRE(parsed.page_checksums.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(store::page_intact(file, parsed, i));
    CHECK(std::memcmp(file.data() + parsed.pages_offset + i * m.page_bytes(), e.pages[i].data(),
                      m.page_bytes()) == 0);
  }
}

TEST_CASE("store format: every flipped byte of the header is detected, a flipped page byte fails that page") {
  testing::SyntheticEntry e = testing::synthetic_entry(42, 6, 5);
  const std::vector<uint8_t> good = file_bytes(e);
  const size_t header = store::header_bytes(e.meta);
  // The checksum covers everything up to itself; the MAC field of an unkeyed entry and the padding after it
  // must be zero, so no header byte is left unchecked.
  const size_t checked = 128 + e.meta.tokens.size() * 4 + e.meta.parents.size() * 16 + e.meta.agent.size() +
                         e.meta.model_name.size() + e.meta.n_pages() * 8 + 8;
  REQUIRE(checked + store::kMacBytes <= header);
  for (size_t i = 0; i < header; ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x10;
    store::ParsedEntry parsed = store::parse_entry(bad);
    CAPTURE(i);
    CHECK(parsed.problem != EntryProblem::Ok);
  }
  for (size_t i = header; i < good.size(); i += 97) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x01;
    store::ParsedEntry parsed = store::parse_entry(bad);
    REQUIRE(parsed.problem == EntryProblem::Ok);
    size_t page = (i - header) / e.meta.page_bytes();
    for (size_t p = 0; p < e.meta.n_pages(); ++p) CHECK(store::page_intact(bad, parsed, p) == (p != page));
  }
}

TEST_CASE(
    "store format: every truncation is detected, and so are trailing bytes, bad magic and another version") {
  testing::SyntheticEntry e = testing::synthetic_entry(7, 9, 5);
  const std::vector<uint8_t> good = file_bytes(e);
  for (size_t n = 0; n < good.size(); ++n) {
    store::ParsedEntry parsed = store::parse_entry(std::span<const uint8_t>(good.data(), n));
    CAPTURE(n);
    CHECK(parsed.problem != EntryProblem::Ok);
  }
  CHECK(store::parse_entry(std::span<const uint8_t>(good.data(), good.size() - 1)).problem ==
        EntryProblem::Truncated);
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  CHECK(store::parse_entry(longer).problem == EntryProblem::Malformed);
  std::vector<uint8_t> magic = good;
  magic[0] = 'X';
  CHECK(store::parse_entry(magic).problem == EntryProblem::NotAnEntry);
  std::vector<uint8_t> version = good;
  version[8] = uint8_t(store::kFormatVersion + 1);  // the version is the u32 after the magic
  CHECK(store::parse_entry(version).problem == EntryProblem::FormatVersion);
}

/// The pages of a synthetic entry as byte spans.
std::vector<std::span<const uint8_t>> page_spans(const testing::SyntheticEntry& e) {
  std::vector<std::span<const uint8_t>> spans;
  for (const auto& page : e.pages)
    spans.emplace_back(reinterpret_cast<const uint8_t*>(page.data()), e.meta.page_bytes());
  return spans;
}

TEST_CASE(
    "store format: a signed entry verifies under its key only, no flipped byte anywhere in it goes unnoticed "
    "by the parse, the page checksums and the MAC together") {
  testing::ScratchDir keys;
  const std::string key_path = (keys.path / "key").string();
  std::ofstream(key_path) << "0123456789abcdef0123456789abcdef";
  ::chmod(key_path.c_str(), 0600);
  const store::EntryAuthenticator key = store::EntryAuthenticator::from_key_file(key_path);
  const uint8_t other_secret[40] = {1};
  const store::EntryAuthenticator other = store::EntryAuthenticator::from_secret(other_secret, "test");
  testing::SyntheticEntry e = testing::synthetic_entry(43, 6, 5);
  const std::vector<uint8_t> good = store::encode_entry(e.meta, page_spans(e), &key);
  REQUIRE(good.size() == store::header_bytes(e.meta) + 2 * e.meta.page_bytes());
  store::ParsedEntry parsed = store::parse_entry(good);
  REQUIRE(parsed.problem == EntryProblem::Ok);
  CHECK(parsed.mac_kind == store::kMacHmacSha256);
  CHECK(store::check_entry_mac(good, parsed, key) == EntryProblem::Ok);
  CHECK(store::check_entry_mac(good, parsed, other) == EntryProblem::BadMac);
  const std::vector<uint8_t> unsigned_file = file_bytes(e);
  CHECK(store::check_entry_mac(unsigned_file, store::parse_entry(unsigned_file), key) ==
        EntryProblem::MissingMac);
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x04;
    store::ParsedEntry p = store::parse_entry(bad);
    CAPTURE(i);
    CHECK((p.problem != EntryProblem::Ok || store::check_entry_mac(bad, p, key) == EntryProblem::BadMac));
  }
}

TEST_CASE("store format: a version 1 entry (no MAC field) is refused as another format version") {
  testing::SyntheticEntry e = testing::synthetic_entry(44, 5, 5);
  std::vector<uint8_t> file = file_bytes(e);
  const uint32_t v1 = 1;
  std::memcpy(file.data() + 8, &v1, sizeof(v1));
  CHECK(store::parse_entry(file).problem == EntryProblem::FormatVersion);
}

TEST_CASE("store format: keys print as 16 hex digits and parse back, anything else is not a key") {
  CHECK(store::key_hex(0x00ab00cd00ef0012ull) == "00ab00cd00ef0012");
  CHECK(store::parse_key_hex("00AB00cd00ef0012") == 0x00ab00cd00ef0012ull);
  CHECK(!store::parse_key_hex("00ab00cd00ef001"));
  CHECK(!store::parse_key_hex("00ab00cd00ef001g"));
  CHECK(!store::parse_key_hex(""));
}

TEST_CASE(
    "store directory: --cache-dir, else $CHOREO_CACHE_DIR, else $XDG_CACHE_HOME/choreo/store, else "
    "~/.cache") {
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv env("CHOREO_CACHE_DIR", "/env/store");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(store::resolve_cache_dir("/flag/dir") == "/flag/dir");
    CHECK(store::resolve_cache_dir("") == "/env/store");
  }
  {
    ScopedEnv env("CHOREO_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(store::resolve_cache_dir("") == "/xdg/choreo/store");
  }
  {
    ScopedEnv env("CHOREO_CACHE_DIR", "");
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    CHECK(store::resolve_cache_dir("") == "/home/someone/.cache/choreo/store");
  }
}

}  // namespace
}  // namespace choreo
