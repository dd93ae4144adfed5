// libFuzzer target for the persistent store's entry format (runtime/store/entry_format): parse_entry promises
// to take any bytes without reading out of bounds. Two modes, picked by the first byte:
// - raw: the rest is an entry file. It must parse or be refused; a parsed entry's pages and E caches must end
//   exactly at the end of the file, and checking every page and E cache must stay in bounds.
// - structured: the rest describes an entry (counts, strings, layout, tokens, parents, E caches), which is encoded
//   (signed with a fixed store key when the input says so) and must parse back to the same metadata, with
//   intact pages and a valid MAC; then one byte chosen by the input is flipped, or the file is cut, and the
//   result must again parse or be refused, never crash, and the damage must show: in the parse, in a page or
//   E-cache checksum, or (signed) in the MAC.
// Checksums make random bytes rarely reach the fields past the header's checksum; the structured mode
// reaches them.

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "runtime/store/entry_auth.h"
#include "runtime/store/entry_format.h"

namespace {

using namespace choreo::store;

/// Reads bytes from the input in order; zeros once it runs out.
struct Reader {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t byte() { return at < size ? data[at++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(byte()) << (8 * i);
    return v;
  }
  uint64_t u64() { return uint64_t(u32()) | (uint64_t(u32()) << 32); }
  std::string text(size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(byte()));
    return s;
  }
};

const EntryAuthenticator& fuzz_key() {
  static const uint8_t secret[32] = {'c', 'h', 'o', 'r', 'e', 'o', '-', 'f', 'u', 'z', 'z'};
  static const EntryAuthenticator key = EntryAuthenticator::from_secret(secret, "fuzz");
  return key;
}

/// Checks what a parse promises; returns true when the file parsed and every page and the MAC (when
/// `keyed`) check out.
bool check_parsed(std::span<const uint8_t> file, const ParsedEntry& parsed, bool keyed) {
  if (parsed.problem != EntryProblem::Ok) {
    if (describe(parsed.problem).empty()) __builtin_trap();
    return false;
  }
  const size_t n_pages = parsed.meta.n_pages(), n_e = parsed.meta.e_layers.size();
  if (parsed.page_checksums.size() != n_pages || parsed.e_checksums.size() != n_e) __builtin_trap();
  if (parsed.e_offset != parsed.pages_offset + n_pages * parsed.meta.page_bytes()) __builtin_trap();
  if (parsed.e_offset + n_e * parsed.meta.e_section_bytes() != file.size()) __builtin_trap();
  if (parsed.mac_offset + kMacBytes > parsed.pages_offset) __builtin_trap();
  bool intact = true;
  for (size_t i = 0; i < n_pages; ++i) intact &= page_intact(file, parsed, i);
  for (size_t j = 0; j < n_e; ++j) intact &= e_section_intact(file, parsed, j);
  if (intact == body_damage(file, parsed).has_value()) __builtin_trap();
  const EntryProblem mac = check_entry_mac(file, parsed, fuzz_key());
  if (mac == EntryProblem::MissingMac && parsed.mac_kind == kMacHmacSha256) __builtin_trap();
  return intact && (!keyed || mac == EntryProblem::Ok);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if ((data[0] & 1) == 0) {
    const std::span<const uint8_t> file(data + 1, size - 1);
    check_parsed(file, parse_entry(file), false);
    return 0;
  }
  const bool keyed = (data[0] & 2) != 0;
  Reader in{data + 1, size - 1};
  EntryMeta meta;
  meta.model_fingerprint = in.u64();
  meta.content_key = in.u64();
  meta.tag = in.u64();
  meta.created_unix_ms = in.u64();
  meta.layout.page_tokens = 1 + in.byte() % 8;
  meta.layout.n_layers = 1 + in.byte() % 3;
  meta.layout.n_kv_heads = 1 + in.byte() % 3;
  meta.layout.head_dim = 1 + in.byte() % 8;
  meta.start_pos = static_cast<int32_t>(in.u32() & 0x7fffffff);
  meta.visibility = in.byte() % 2;
  const size_t n_tokens = 1 + in.byte() % 40, n_parents = in.byte() % 6;
  for (size_t i = 0; i < n_tokens; ++i) meta.tokens.push_back(static_cast<int32_t>(in.u32()));
  for (size_t i = 0; i < n_parents; ++i) meta.parents.push_back({in.u64(), static_cast<int64_t>(in.u64())});
  meta.agent = in.text(in.byte() % 24);
  meta.model_name = in.text(in.byte() % 24);
  // Pages: bytes from the input (any float bit patterns), with their checksums.
  const size_t page_bytes = meta.page_bytes();
  std::vector<uint8_t> pages(meta.n_pages() * page_bytes);
  for (uint8_t& b : pages) b = in.byte();
  std::vector<uint64_t> sums;
  std::vector<std::span<const uint8_t>> page_spans;
  for (size_t i = 0; i < meta.n_pages(); ++i) {
    sums.push_back(XXH3_64bits(pages.data() + i * page_bytes, page_bytes));
    page_spans.emplace_back(pages.data() + i * page_bytes, page_bytes);
  }
  // E caches: an ascending subset of the layers (a bit mask), rows of e_dim floats per token.
  const uint8_t e_mask = in.byte();
  for (int layer = 0; layer < meta.layout.n_layers; ++layer)
    if (e_mask & (1u << layer)) meta.e_layers.push_back(uint32_t(layer));
  if (!meta.e_layers.empty()) meta.e_dim = 1 + in.byte() % 6;
  std::vector<uint8_t> e_bytes(meta.e_layers.size() * meta.e_section_bytes());
  for (uint8_t& b : e_bytes) b = in.byte();
  for (size_t j = 0; j < meta.e_layers.size(); ++j) {
    const uint8_t* section = e_bytes.data() + j * meta.e_section_bytes();
    sums.push_back(XXH3_64bits(section, meta.e_section_bytes()));
    page_spans.emplace_back(section, meta.e_section_bytes());
  }
  std::vector<uint8_t> file = encode_entry(meta, page_spans, keyed ? &fuzz_key() : nullptr);
  if (file.size() != header_bytes(meta) + pages.size() + e_bytes.size()) __builtin_trap();

  const ParsedEntry parsed = parse_entry(file);
  if (parsed.problem != EntryProblem::Ok) __builtin_trap();  // what encode_header wrote must read back
  const EntryMeta& m = parsed.meta;
  if (m.model_fingerprint != meta.model_fingerprint || m.content_key != meta.content_key || m.tag != meta.tag ||
      m.created_unix_ms != meta.created_unix_ms || m.tokens != meta.tokens || m.parents != meta.parents ||
      m.agent != meta.agent || m.model_name != meta.model_name || m.start_pos != meta.start_pos ||
      m.visibility != meta.visibility || m.layout.page_tokens != meta.layout.page_tokens ||
      m.layout.n_layers != meta.layout.n_layers || m.layout.n_kv_heads != meta.layout.n_kv_heads ||
      m.layout.head_dim != meta.layout.head_dim || m.e_layers != meta.e_layers || m.e_dim != meta.e_dim)
    __builtin_trap();
  std::vector<uint64_t> parsed_sums = parsed.page_checksums;
  parsed_sums.insert(parsed_sums.end(), parsed.e_checksums.begin(), parsed.e_checksums.end());
  if (parsed_sums != sums) __builtin_trap();
  if (!check_parsed(file, parsed, keyed)) __builtin_trap();
  if (parsed.mac_kind != (keyed ? kMacHmacSha256 : kMacNone)) __builtin_trap();

  // One corruption: flip a byte, or cut the file.
  const uint32_t where = in.u32();
  const uint8_t how = in.byte();
  if (how & 1) {
    file.resize(where % file.size());
  } else {
    file[where % file.size()] ^= static_cast<uint8_t>(how | 2);
  }
  // Every header byte is checked, every page and E-cache byte is under its checksum, and a signed file is
  // under its MAC: no single flip or cut may leave a file that passes every check. (A flip that kept an
  // XXH3-64 would need a hash collision.)
  if (check_parsed(file, parse_entry(file), keyed)) __builtin_trap();
  return 0;
}
