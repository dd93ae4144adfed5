// The store's entry format (runtime/store/entry_format.h): what is written parses back identically, and no
// damage to the checked bytes — a flipped byte, a truncation, trailing bytes, another version — goes
// unnoticed.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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

/// A synthetic entry with E caches at `layers`: every token's row of `dim` floats per layer, a pure
/// function of the key; returned as (meta, body: the pages then the E sections).
struct EntryWithE {
  testing::SyntheticEntry e;
  std::vector<std::vector<float>> sections;
  std::vector<std::span<const uint8_t>> body() const {
    std::vector<std::span<const uint8_t>> out = page_spans(e);
    for (const auto& s : sections) out.emplace_back(reinterpret_cast<const uint8_t*>(s.data()), s.size() * 4);
    return out;
  }
};

EntryWithE entry_with_e(uint64_t key, int n_tokens, std::vector<uint32_t> layers, uint32_t dim) {
  EntryWithE out{testing::synthetic_entry(key, n_tokens, 5), {}};
  out.e.meta.e_layers = std::move(layers);
  out.e.meta.e_dim = dim;
  for (uint32_t layer : out.e.meta.e_layers) {
    std::vector<float> rows(size_t(n_tokens) * dim);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = float(key % 97) + float(layer) * 0.5f + float(i) * 0.25f;
    out.sections.push_back(std::move(rows));
  }
  return out;
}

/// Writes the header checksum of an entry again after its first `checked` bytes were edited.
void reseal(std::vector<uint8_t>& file, size_t checked) {
  const uint64_t sum = XXH3_64bits(file.data(), checked);
  std::memcpy(file.data() + checked, &sum, sizeof(sum));
}

TEST_CASE("store format: E caches after the pages read back exactly, and each is covered by its checksum and the MAC") {
  const EntryWithE w = entry_with_e(91, 7, {0, 1}, 3);
  const std::vector<uint8_t> file = store::encode_entry(w.e.meta, w.body());
  const size_t header = store::header_bytes(w.e.meta);
  REQUIRE(file.size() == header + w.e.meta.n_pages() * w.e.meta.page_bytes() + 2 * 7 * 3 * 4);
  const store::ParsedEntry parsed = store::parse_entry(file);
  REQUIRE(parsed.problem == EntryProblem::Ok);
  CHECK(parsed.meta.e_layers == std::vector<uint32_t>{0, 1});
  CHECK(parsed.meta.e_dim == 3);
  CHECK(!store::body_damage(file, parsed));
  const int want[] = {1};
  const std::map<int, std::vector<float>> e = store::e_sections(file, parsed, want);
  REQUIRE(e.size() == 1);
  CHECK(e.at(1) == w.sections[1]);
  // Every header byte is still checked (the E layer list and checksums sit before the header checksum).
  for (size_t i = 0; i < header; ++i) {
    std::vector<uint8_t> bad = file;
    bad[i] ^= 0x10;
    CAPTURE(i);
    CHECK(store::parse_entry(bad).problem != EntryProblem::Ok);
  }
  // A flipped byte in an E section names its layer; the pages stay intact.
  for (size_t j = 0; j < 2; ++j) {
    std::vector<uint8_t> bad = file;
    bad[parsed.e_offset + j * parsed.meta.e_section_bytes() + 5] ^= 0x01;
    const store::ParsedEntry p = store::parse_entry(bad);
    REQUIRE(p.problem == EntryProblem::Ok);
    CHECK(store::body_damage(bad, p) == fmt::format("E cache checksum mismatch (layer {})", j));
    for (size_t i = 0; i < p.meta.n_pages(); ++i) CHECK(store::page_intact(bad, p, i));
  }
  // Layers out of order, or beyond the model's, are malformed even with a right header checksum.
  const size_t checked = 128 + w.e.meta.tokens.size() * 4 + w.e.meta.parents.size() * 16 + w.e.meta.agent.size() +
                         w.e.meta.model_name.size() + w.e.meta.n_pages() * 8 + 2 * 12;
  const size_t layers_at = checked - 2 * 12;
  for (const auto& [first, second] : {std::pair{1u, 0u}, std::pair{0u, 2u}, std::pair{1u, 1u}}) {
    std::vector<uint8_t> bad = file;
    std::memcpy(bad.data() + layers_at, &first, 4);
    std::memcpy(bad.data() + layers_at + 4, &second, 4);
    reseal(bad, checked);
    CHECK(store::parse_entry(bad).problem == EntryProblem::Malformed);
  }
  // Signed: the MAC covers the E sections too.
  testing::ScratchDir keys;
  const std::string key_path = (keys.path / "key").string();
  std::ofstream(key_path) << "0123456789abcdef0123456789abcdef";
  ::chmod(key_path.c_str(), 0600);
  const store::EntryAuthenticator key = store::EntryAuthenticator::from_key_file(key_path);
  std::vector<uint8_t> signed_file = store::encode_entry(w.e.meta, w.body(), &key);
  const store::ParsedEntry sp = store::parse_entry(signed_file);
  REQUIRE(sp.problem == EntryProblem::Ok);
  CHECK(store::check_entry_mac(signed_file, sp, key) == EntryProblem::Ok);
  signed_file.back() ^= 0x01;
  CHECK(store::check_entry_mac(signed_file, sp, key) == EntryProblem::BadMac);
}

TEST_CASE("store format: a version 2 entry (before E caches) reads as one without E caches") {
  testing::SyntheticEntry e = testing::synthetic_entry(44, 6, 5);
  std::vector<uint8_t> file = file_bytes(e);
  const uint32_t v2 = 2;
  std::memcpy(file.data() + 8, &v2, 4);
  const size_t checked = 128 + e.meta.tokens.size() * 4 + e.meta.parents.size() * 16 + e.meta.agent.size() +
                         e.meta.model_name.size() + e.meta.n_pages() * 8;
  reseal(file, checked);
  const store::ParsedEntry parsed = store::parse_entry(file);
  REQUIRE(parsed.problem == EntryProblem::Ok);
  CHECK(parsed.meta.e_layers.empty());
  CHECK(parsed.meta.tokens == e.meta.tokens);
  CHECK(!store::body_damage(file, parsed));
  const uint32_t v1 = 1;
  std::memcpy(file.data() + 8, &v1, 4);
  reseal(file, checked);
  CHECK(store::parse_entry(file).problem == EntryProblem::FormatVersion);
}

TEST_CASE("store format: a header whose sizes overflow 64 bits is malformed, never read past the file") {
  // Two pages of 65536 tokens; the header then claims a layout whose page size is 2^63 bytes, so that the two
  // pages wrap around to zero bytes and the file would end at the header.
  kernels::KvLayout layout;
  layout.page_tokens = 65536;
  layout.n_layers = 1;
  layout.n_kv_heads = 1;
  layout.head_dim = 4;
  testing::SyntheticEntry e = testing::synthetic_entry(45, 65537, 5, layout);
  std::vector<uint8_t> file = file_bytes(e);
  const size_t checked = 128 + e.meta.tokens.size() * 4 + e.meta.parents.size() * 16 + e.meta.agent.size() +
                         e.meta.model_name.size() + e.meta.n_pages() * 8;
  REQUIRE(store::parse_entry(file).problem == EntryProblem::Ok);
  // 2^14 layers * 2^16 tokens * (K and V rows of 2^16 heads * 2^14 floats of 4 bytes) = 2^63.
  const uint32_t n_layers = 1u << 14, n_kv_heads = 1u << 16, head_dim = 1u << 14;
  const uint64_t page_bytes = uint64_t(1) << 63;
  std::memcpy(file.data() + 80, &n_layers, 4);
  std::memcpy(file.data() + 84, &n_kv_heads, 4);
  std::memcpy(file.data() + 88, &head_dim, 4);
  std::memcpy(file.data() + 96, &page_bytes, 8);
  reseal(file, checked);
  file.resize(store::header_bytes(e.meta));
  CHECK(store::parse_entry(file).problem == EntryProblem::Malformed);
}

}  // namespace
}  // namespace choreo
