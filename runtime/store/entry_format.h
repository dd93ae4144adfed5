#pragma once
// The on-disk format of one persisted message ("entry"), documented in docs/store.md:
//   fixed header (128 bytes) | tokens | parents | agent | model name | page checksums | E-cache layers |
//   E-cache checksums | header checksum | MAC (32 bytes, zero when the entry is unkeyed) | zero padding to a
//   multiple of 64 bytes | pages (K/V exactly as in the page pool, one after another) | E caches (one section
//   per layer: every token's hidden state at that layer's input, `e_dim` floats per token).
// All integers are little-endian (the host order of every machine choreo builds for; a big-endian reader
// sees a foreign format version and ignores the file). Nothing here touches the file system.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.h"
#include "common/token.h"
#include "runtime/store/entry_auth.h"

namespace choreo::store {

inline constexpr char kEntryMagic[8] = {'C', 'H', 'O', 'R', 'E', 'O', 'K', 'V'};
/// Bumped whenever the layout below changes; files of other versions are ignored (and re-encoded).
/// 1: no MAC field. 2: a MAC field after the header checksum, and the header's `mac_kind`. 3: E caches after
/// the pages (the header's `n_e_layers` and `e_dim`; version 2 files are read as entries without any).
inline constexpr uint32_t kFormatVersion = 3;
/// What the MAC field of an entry holds.
inline constexpr uint32_t kMacNone = 0;        // nothing (zeros): written without a store key
inline constexpr uint32_t kMacHmacSha256 = 1;  // HMAC-SHA256 of the header before the MAC and of every page
/// The header's `kv_dtype` names the cache types of the stored K/V: the K type's ggml id in the low 16 bits,
/// the V type's in the high 16 (f32 K and V: 0, as every entry written before other types existed).
uint32_t kv_dtype_code(const kernels::KvLayout& layout);

/// A parent of a stored message: its content key and the logical offset it was placed at.
struct EntryParent {
  uint64_t key = 0;
  int64_t offset = 0;
  bool operator==(const EntryParent&) const = default;
};

/// Everything an entry says about its message, except the K/V bytes.
struct EntryMeta {
  uint64_t model_fingerprint = 0;
  uint64_t content_key = 0;
  uint64_t tag = 0;  // opaque to the store (e.g. a PML schema hash); 0 = none
  uint64_t created_unix_ms = 0;
  std::string model_name;  // file name of the model, for people reading `choreo cache ls`
  std::vector<Token> tokens;
  int32_t start_pos = 0;
  std::vector<EntryParent> parents;
  std::string agent;
  uint32_t visibility = 0;  // kv::Visibility as an integer
  kernels::KvLayout layout;  // with its cache types
  // The E caches stored after the pages (DESIGN.md §6): the layers (ascending, below layout.n_layers), and
  // the floats per token of each (the model's dim; 0 when there are none).
  std::vector<uint32_t> e_layers;
  uint32_t e_dim = 0;

  size_t n_pages() const;
  size_t page_bytes() const;
  /// Bytes of one E-cache section: every token's row of e_dim floats.
  size_t e_section_bytes() const;
};

/// Why an entry cannot be used; `Ok` when it can.
enum class EntryProblem {
  Ok,
  NotAnEntry,      // wrong magic
  FormatVersion,   // written by another format version
  Truncated,       // the file ends before its declared size
  Malformed,       // impossible counts, sizes or trailing bytes
  HeaderChecksum,  // the header's XXH3 does not match
  PageChecksum,    // some page's XXH3 does not match
  ECacheChecksum,  // some E-cache section's XXH3 does not match
  WrongKey,        // the header's content key is not the one the file is named after
  WrongModel,      // another model's fingerprint
  WrongLayout,     // another KV layout (layers, KV heads, head dim, page tokens, dtype)
  MissingMac,      // the store is keyed and the entry carries no MAC
  BadMac,          // the store is keyed and the entry's MAC does not match (another key, or forged)
};
/// True for the problems that depend on the reader's store key (MissingMac, BadMac): such an entry may be
/// fine for another reader, so gc does not count it as unreadable.
bool depends_on_key(EntryProblem problem);
/// A short human description of a problem ("header checksum mismatch").
std::string_view describe(EntryProblem problem);

/// Bytes before the first page (always a multiple of 64).
size_t header_bytes(const EntryMeta& meta);

/// The header bytes of an entry whose body sections (its pages, then its E-cache sections, in order) have
/// these XXH3-64 checksums, with `mac_kind` recorded and the MAC field zero (sign_header fills it in).
std::vector<uint8_t> encode_header(const EntryMeta& meta, std::span<const uint64_t> section_checksums,
                                   uint32_t mac_kind = kMacNone);

/// Writes the MAC of an entry into its header (made by encode_header with kMacHmacSha256): the MAC covers
/// every header byte before the MAC field (so every field, the checksums and the header checksum) and then
/// every byte of the body (its pages, then its E-cache sections), in order.
void sign_header(std::span<uint8_t> header, std::span<const std::span<const uint8_t>> body,
                 const EntryAuthenticator& auth);

/// A whole entry file in memory: the header (signed when `auth` is given), then the body: meta.n_pages()
/// pages followed by one E-cache section per meta.e_layers.
std::vector<uint8_t> encode_entry(const EntryMeta& meta, std::span<const std::span<const uint8_t>> body,
                                  const EntryAuthenticator* auth = nullptr);

/// A parsed entry whose header was checked: `meta` and where each page and its checksum are.
struct ParsedEntry {
  EntryProblem problem = EntryProblem::Ok;
  EntryMeta meta;
  std::vector<uint64_t> page_checksums;
  std::vector<uint64_t> e_checksums;  // one per meta.e_layers
  size_t pages_offset = 0;  // byte offset of page 0
  size_t e_offset = 0;      // byte offset of the first E-cache section (the end of the pages)
  uint32_t mac_kind = kMacNone;
  size_t mac_offset = 0;  // byte offset of the MAC field
  Mac mac{};
};

/// Parses and checks the header of an entry file's bytes (any bytes: never reads out of bounds). On any
/// problem, `problem` says which and the rest is unspecified. Pages are not checked here (see page_intact).
ParsedEntry parse_entry(std::span<const uint8_t> file);

/// True when page `i` of a parsed entry matches its checksum.
bool page_intact(std::span<const uint8_t> file, const ParsedEntry& entry, size_t i);

/// The bytes of E-cache section `j` of a parsed entry (the layer meta.e_layers[j]).
std::span<const uint8_t> e_section(std::span<const uint8_t> file, const ParsedEntry& entry, size_t j);
/// True when E-cache section `j` of a parsed entry matches its checksum.
bool e_section_intact(std::span<const uint8_t> file, const ParsedEntry& entry, size_t j);

/// What in a parsed entry's body fails its checksum ("page checksum mismatch (page 3)", "E cache checksum
/// mismatch (layer 2)"), or nullopt when every page and E-cache section is intact.
std::optional<std::string> body_damage(std::span<const uint8_t> file, const ParsedEntry& entry);

/// Checks a parsed entry (problem Ok) against the store key: Ok when its MAC is right, MissingMac when it
/// carries none, BadMac otherwise. Reads every byte of the file.
EntryProblem check_entry_mac(std::span<const uint8_t> file, const ParsedEntry& entry,
                             const EntryAuthenticator& auth);

}  // namespace choreo::store
