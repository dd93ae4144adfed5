#include "runtime/store/entry_format.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <stdexcept>
#include <optional>
#include <utility>

namespace choreo::store {

namespace {

/// The fixed part of the header, exactly as on disk.
struct FixedHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  uint64_t model_fingerprint;
  uint64_t content_key;
  uint64_t tag;
  uint64_t created_unix_ms;
  int32_t start_pos;
  uint32_t n_tokens;
  uint32_t n_parents;
  uint32_t visibility;
  uint32_t agent_bytes;
  uint32_t model_name_bytes;
  uint32_t kv_dtype;
  uint32_t page_tokens;
  uint32_t n_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t n_pages;
  uint64_t page_bytes;
  uint32_t mac_kind;
  uint32_t n_e_layers;  // version 3 (zero, as reserved, in version 2)
  uint32_t e_dim;       // version 3 (zero, as reserved, in version 2)
  uint32_t reserved32;
  uint64_t reserved;
};
static_assert(sizeof(FixedHeader) == 128, "the fixed header is 128 bytes on disk");

// Bounds that no real entry reaches; they keep size arithmetic far from overflow on hostile files.
constexpr uint64_t kMaxTokens = uint64_t(1) << 24;
constexpr uint64_t kMaxParents = uint64_t(1) << 20;
constexpr uint64_t kMaxNameBytes = uint64_t(1) << 16;
constexpr uint64_t kMaxLayoutDim = uint64_t(1) << 16;
constexpr uint64_t kMaxEDim = uint64_t(1) << 20;
/// The oldest format version still read (version 2 is version 3 without E caches).
constexpr uint32_t kOldestReadVersion = 2;

/// a * b, or nullopt when it does not fit in 64 bits (hostile headers reach that).
std::optional<uint64_t> times(uint64_t a, uint64_t b) {
  uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

size_t round_up_64(size_t n) { return (n + 63) / 64 * 64; }

bool all_zero(std::span<const uint8_t> bytes) {
  for (uint8_t b : bytes)
    if (b != 0) return false;
  return true;
}

/// Bytes of the header up to (excluding) the header checksum.
uint64_t checked_bytes(uint64_t n_tokens, uint64_t n_parents, uint64_t agent_bytes, uint64_t name_bytes,
                       uint64_t n_pages, uint64_t n_e_layers) {
  return sizeof(FixedHeader) + n_tokens * sizeof(int32_t) + n_parents * 2 * sizeof(uint64_t) + agent_bytes +
         name_bytes + n_pages * sizeof(uint64_t) + n_e_layers * (sizeof(uint32_t) + sizeof(uint64_t));
}

/// Bytes of the header: everything checked, the header checksum, the MAC field, padding.
uint64_t total_header_bytes(uint64_t before_checksum) {
  return round_up_64(before_checksum + sizeof(uint64_t) + kMacBytes);
}

/// Where the MAC field of a header starts (right after the header checksum).
size_t mac_offset_of(const FixedHeader& h) {
  const uint64_t n_pages = (uint64_t(h.n_tokens) + h.page_tokens - 1) / h.page_tokens;
  return checked_bytes(h.n_tokens, h.n_parents, h.agent_bytes, h.model_name_bytes, n_pages, h.n_e_layers) +
         sizeof(uint64_t);
}

/// The cache types a kv_dtype code names, when they are types choreo stores.
std::optional<std::pair<kernels::DType, kernels::DType>> kv_types_of(uint32_t code) {
  auto type = [](uint32_t id) -> std::optional<kernels::DType> {
    for (kernels::DType t : {kernels::DType::F32, kernels::DType::F16, kernels::DType::Q8_0})
      if (uint32_t(t) == id) return t;
    return std::nullopt;
  };
  const std::optional<kernels::DType> k = type(code & 0xffff), v = type(code >> 16);
  if (!k || !v) return std::nullopt;
  return std::pair{*k, *v};
}

/// Bytes of one page of this shape in these types; nullopt when a type's blocks do not divide a head, or
/// when the size does not fit in 64 bits.
std::optional<uint64_t> layout_page_bytes(uint64_t page_tokens, uint64_t n_layers, uint64_t n_kv_heads,
                                          uint64_t head_dim, kernels::DType k_type, kernels::DType v_type) {
  uint64_t row = 0;
  for (kernels::DType t : {k_type, v_type}) {
    const kernels::TypeTraits tr = kernels::type_traits(t);
    if (head_dim % tr.block_elems != 0) return std::nullopt;
    row += n_kv_heads * head_dim / tr.block_elems * tr.block_bytes;  // each factor < 2^16: no overflow
  }
  const std::optional<uint64_t> rows = times(n_layers, page_tokens);
  return rows ? times(*rows, row) : std::nullopt;
}

/// Bytes after the header (pages, then E-cache sections), or nullopt when that does not fit in 64 bits.
std::optional<uint64_t> body_bytes(uint64_t n_pages, uint64_t page_bytes, uint64_t n_e_layers,
                                   uint64_t e_section_bytes) {
  const std::optional<uint64_t> pages = times(n_pages, page_bytes);
  const std::optional<uint64_t> e = times(n_e_layers, e_section_bytes);
  if (!pages || !e || *pages > UINT64_MAX - *e) return std::nullopt;
  return *pages + *e;
}

}  // namespace

size_t EntryMeta::n_pages() const {
  return layout.page_tokens > 0 ? layout.pages_for(tokens.size()) : 0;
}

size_t EntryMeta::page_bytes() const { return layout.page_bytes(); }

size_t EntryMeta::e_section_bytes() const { return tokens.size() * e_dim * sizeof(float); }

uint32_t kv_dtype_code(const kernels::KvLayout& layout) {
  return uint32_t(layout.k_type) | uint32_t(layout.v_type) << 16;
}

std::string_view describe(EntryProblem problem) {
  switch (problem) {
    case EntryProblem::Ok:
      return "ok";
    case EntryProblem::NotAnEntry:
      return "not a choreo store entry (bad magic)";
    case EntryProblem::FormatVersion:
      return "written by another store format version";
    case EntryProblem::Truncated:
      return "truncated";
    case EntryProblem::Malformed:
      return "malformed header";
    case EntryProblem::HeaderChecksum:
      return "header checksum mismatch";
    case EntryProblem::PageChecksum:
      return "page checksum mismatch";
    case EntryProblem::ECacheChecksum:
      return "E cache checksum mismatch";
    case EntryProblem::WrongKey:
      return "content key does not match the file name";
    case EntryProblem::WrongModel:
      return "written by another model";
    case EntryProblem::WrongLayout:
      return "another KV layout";
    case EntryProblem::MissingMac:
      return "no MAC (written without the store key)";
    case EntryProblem::BadMac:
      return "MAC mismatch (written with another key, or forged)";
  }
  return "?";
}

bool depends_on_key(EntryProblem problem) {
  return problem == EntryProblem::MissingMac || problem == EntryProblem::BadMac;
}

size_t header_bytes(const EntryMeta& meta) {
  return total_header_bytes(checked_bytes(meta.tokens.size(), meta.parents.size(), meta.agent.size(),
                                          meta.model_name.size(), meta.n_pages(), meta.e_layers.size()));
}

std::vector<uint8_t> encode_header(const EntryMeta& meta, std::span<const uint64_t> section_checksums,
                                   uint32_t mac_kind) {
  const size_t n_pages = meta.n_pages();
  if (section_checksums.size() != n_pages + meta.e_layers.size() || (meta.e_dim == 0) != meta.e_layers.empty())
    throw std::invalid_argument("encode_header: one checksum per page and per E-cache section, and an E dim with them");
  const std::span<const uint64_t> page_checksums = section_checksums.first(n_pages);
  const std::span<const uint64_t> e_checksums = section_checksums.subspan(n_pages);
  FixedHeader h{};
  std::memcpy(h.magic, kEntryMagic, sizeof(h.magic));
  h.format_version = kFormatVersion;
  h.header_bytes = uint32_t(header_bytes(meta));
  h.model_fingerprint = meta.model_fingerprint;
  h.content_key = meta.content_key;
  h.tag = meta.tag;
  h.created_unix_ms = meta.created_unix_ms;
  h.start_pos = meta.start_pos;
  h.n_tokens = uint32_t(meta.tokens.size());
  h.n_parents = uint32_t(meta.parents.size());
  h.visibility = meta.visibility;
  h.agent_bytes = uint32_t(meta.agent.size());
  h.model_name_bytes = uint32_t(meta.model_name.size());
  h.kv_dtype = kv_dtype_code(meta.layout);
  h.page_tokens = uint32_t(meta.layout.page_tokens);
  h.n_layers = uint32_t(meta.layout.n_layers);
  h.n_kv_heads = uint32_t(meta.layout.n_kv_heads);
  h.head_dim = uint32_t(meta.layout.head_dim);
  h.n_pages = uint32_t(page_checksums.size());
  h.page_bytes = meta.page_bytes();
  h.mac_kind = mac_kind;
  h.n_e_layers = uint32_t(meta.e_layers.size());
  h.e_dim = meta.e_dim;

  std::vector<uint8_t> out(h.header_bytes, 0);
  uint8_t* p = out.data();
  auto put = [&p](const void* src, size_t n) {
    if (n) std::memcpy(p, src, n);
    p += n;
  };
  put(&h, sizeof(h));
  put(meta.tokens.data(), meta.tokens.size() * sizeof(int32_t));
  for (const EntryParent& parent : meta.parents) {
    put(&parent.key, sizeof(parent.key));
    put(&parent.offset, sizeof(parent.offset));
  }
  put(meta.agent.data(), meta.agent.size());
  put(meta.model_name.data(), meta.model_name.size());
  put(page_checksums.data(), page_checksums.size() * sizeof(uint64_t));
  put(meta.e_layers.data(), meta.e_layers.size() * sizeof(uint32_t));
  put(e_checksums.data(), e_checksums.size() * sizeof(uint64_t));
  uint64_t checksum = XXH3_64bits(out.data(), size_t(p - out.data()));
  put(&checksum, sizeof(checksum));
  return out;  // the MAC field and the padding stay zero
}

void sign_header(std::span<uint8_t> header, std::span<const std::span<const uint8_t>> body,
                 const EntryAuthenticator& auth) {
  FixedHeader h;
  std::memcpy(&h, header.data(), sizeof(h));
  const size_t at = mac_offset_of(h);
  std::vector<std::span<const uint8_t>> parts{std::span<const uint8_t>(header.data(), at)};
  parts.insert(parts.end(), body.begin(), body.end());
  const Mac tag = auth.mac(parts);
  std::memcpy(header.data() + at, tag.data(), tag.size());
}

std::vector<uint8_t> encode_entry(const EntryMeta& meta, std::span<const std::span<const uint8_t>> body,
                                  const EntryAuthenticator* auth) {
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i].size() != (i < meta.n_pages() ? meta.page_bytes() : meta.e_section_bytes()))
      throw std::invalid_argument("encode_entry: a body section of the wrong size");
    sums.push_back(XXH3_64bits(body[i].data(), body[i].size()));
  }
  std::vector<uint8_t> file = encode_header(meta, sums, auth ? kMacHmacSha256 : kMacNone);
  if (auth) sign_header(file, body, *auth);
  for (std::span<const uint8_t> section : body) file.insert(file.end(), section.begin(), section.end());
  return file;
}

ParsedEntry parse_entry(std::span<const uint8_t> file) {
  ParsedEntry e;
  auto fail = [&e](EntryProblem p) {
    e.problem = p;
    return e;
  };
  if (file.size() < sizeof(kEntryMagic) || std::memcmp(file.data(), kEntryMagic, sizeof(kEntryMagic)) != 0)
    return fail(file.size() < sizeof(kEntryMagic) ? EntryProblem::Truncated : EntryProblem::NotAnEntry);
  if (file.size() < sizeof(FixedHeader)) return fail(EntryProblem::Truncated);
  FixedHeader h;
  std::memcpy(&h, file.data(), sizeof(h));
  if (h.format_version < kOldestReadVersion || h.format_version > kFormatVersion)
    return fail(EntryProblem::FormatVersion);
  if (h.n_tokens == 0 || h.n_tokens > kMaxTokens || h.n_parents > kMaxParents ||
      h.agent_bytes > kMaxNameBytes || h.model_name_bytes > kMaxNameBytes || h.start_pos < 0 ||
      h.page_tokens == 0 || h.n_layers == 0 || h.n_kv_heads == 0 || h.head_dim == 0 ||
      h.page_tokens > kMaxLayoutDim || h.n_layers > kMaxLayoutDim || h.n_kv_heads > kMaxLayoutDim ||
      h.head_dim > kMaxLayoutDim || h.n_e_layers > h.n_layers || h.e_dim > kMaxEDim ||
      (h.n_e_layers == 0) != (h.e_dim == 0) || h.reserved32 != 0 || h.reserved != 0)
    return fail(EntryProblem::Malformed);
  const uint64_t n_pages = (uint64_t(h.n_tokens) + h.page_tokens - 1) / h.page_tokens;
  if (h.n_pages != n_pages) return fail(EntryProblem::Malformed);
  const uint64_t before_checksum =
      checked_bytes(h.n_tokens, h.n_parents, h.agent_bytes, h.model_name_bytes, n_pages, h.n_e_layers);
  if (h.header_bytes != total_header_bytes(before_checksum)) return fail(EntryProblem::Malformed);
  if (h.header_bytes > file.size()) return fail(EntryProblem::Truncated);
  uint64_t stored_checksum;
  std::memcpy(&stored_checksum, file.data() + before_checksum, sizeof(stored_checksum));
  if (XXH3_64bits(file.data(), before_checksum) != stored_checksum) return fail(EntryProblem::HeaderChecksum);
  // The header is intact from here on: remaining checks are about the rest of the file.
  const std::optional<std::pair<kernels::DType, kernels::DType>> types = kv_types_of(h.kv_dtype);
  if (!types) return fail(EntryProblem::Malformed);
  if (h.page_bytes == 0 ||
      h.page_bytes !=
          layout_page_bytes(h.page_tokens, h.n_layers, h.n_kv_heads, h.head_dim, types->first, types->second))
    return fail(EntryProblem::Malformed);
  // An unkeyed entry's MAC field is zero, and the padding always is: no header byte goes unchecked.
  const size_t mac_at = before_checksum + sizeof(uint64_t);
  if (h.mac_kind != kMacNone && h.mac_kind != kMacHmacSha256) return fail(EntryProblem::Malformed);
  if (h.mac_kind == kMacNone && !all_zero(file.subspan(mac_at, kMacBytes)))
    return fail(EntryProblem::Malformed);
  if (!all_zero(file.subspan(mac_at + kMacBytes, h.header_bytes - mac_at - kMacBytes)))
    return fail(EntryProblem::Malformed);
  const uint64_t e_section_bytes = uint64_t(h.n_tokens) * h.e_dim * sizeof(float);  // < 2^46
  const std::optional<uint64_t> body = body_bytes(n_pages, h.page_bytes, h.n_e_layers, e_section_bytes);
  if (!body || *body > UINT64_MAX - h.header_bytes) return fail(EntryProblem::Malformed);
  const uint64_t total = h.header_bytes + *body;
  if (file.size() < total) return fail(EntryProblem::Truncated);
  if (file.size() > total) return fail(EntryProblem::Malformed);

  EntryMeta& m = e.meta;
  m.model_fingerprint = h.model_fingerprint;
  m.content_key = h.content_key;
  m.tag = h.tag;
  m.created_unix_ms = h.created_unix_ms;
  m.start_pos = h.start_pos;
  m.visibility = h.visibility;
  m.layout.k_type = types->first;
  m.layout.v_type = types->second;
  m.layout.page_tokens = int(h.page_tokens);
  m.layout.n_layers = int(h.n_layers);
  m.layout.n_kv_heads = int(h.n_kv_heads);
  m.layout.head_dim = int(h.head_dim);
  const uint8_t* p = file.data() + sizeof(FixedHeader);
  m.tokens.resize(h.n_tokens);
  std::memcpy(m.tokens.data(), p, h.n_tokens * sizeof(int32_t));
  p += h.n_tokens * sizeof(int32_t);
  m.parents.resize(h.n_parents);
  for (EntryParent& parent : m.parents) {
    std::memcpy(&parent.key, p, sizeof(parent.key));
    std::memcpy(&parent.offset, p + sizeof(parent.key), sizeof(parent.offset));
    p += 2 * sizeof(uint64_t);
  }
  m.agent.assign(reinterpret_cast<const char*>(p), h.agent_bytes);
  p += h.agent_bytes;
  m.model_name.assign(reinterpret_cast<const char*>(p), h.model_name_bytes);
  p += h.model_name_bytes;
  e.page_checksums.resize(n_pages);
  std::memcpy(e.page_checksums.data(), p, n_pages * sizeof(uint64_t));
  p += n_pages * sizeof(uint64_t);
  m.e_dim = h.e_dim;
  m.e_layers.resize(h.n_e_layers);
  if (h.n_e_layers) std::memcpy(m.e_layers.data(), p, h.n_e_layers * sizeof(uint32_t));  // (never a null memcpy)
  p += h.n_e_layers * sizeof(uint32_t);
  for (size_t j = 0; j < m.e_layers.size(); ++j)
    if (m.e_layers[j] >= h.n_layers || (j > 0 && m.e_layers[j] <= m.e_layers[j - 1]))
      return fail(EntryProblem::Malformed);  // layers are ascending and the model's
  e.e_checksums.resize(h.n_e_layers);
  if (h.n_e_layers) std::memcpy(e.e_checksums.data(), p, h.n_e_layers * sizeof(uint64_t));
  e.pages_offset = h.header_bytes;
  e.e_offset = size_t(h.header_bytes + n_pages * h.page_bytes);
  e.mac_kind = h.mac_kind;
  e.mac_offset = mac_at;
  std::memcpy(e.mac.data(), file.data() + mac_at, kMacBytes);
  return e;
}

bool page_intact(std::span<const uint8_t> file, const ParsedEntry& entry, size_t i) {
  const size_t bytes = entry.meta.page_bytes();
  return XXH3_64bits(file.data() + entry.pages_offset + i * bytes, bytes) == entry.page_checksums[i];
}

std::span<const uint8_t> e_section(std::span<const uint8_t> file, const ParsedEntry& entry, size_t j) {
  const size_t bytes = entry.meta.e_section_bytes();
  return file.subspan(entry.e_offset + j * bytes, bytes);
}

bool e_section_intact(std::span<const uint8_t> file, const ParsedEntry& entry, size_t j) {
  const std::span<const uint8_t> section = e_section(file, entry, j);
  return XXH3_64bits(section.data(), section.size()) == entry.e_checksums[j];
}

std::optional<std::string> body_damage(std::span<const uint8_t> file, const ParsedEntry& entry) {
  for (size_t i = 0; i < entry.page_checksums.size(); ++i)
    if (!page_intact(file, entry, i)) return fmt::format("{} (page {})", describe(EntryProblem::PageChecksum), i);
  for (size_t j = 0; j < entry.e_checksums.size(); ++j)
    if (!e_section_intact(file, entry, j))
      return fmt::format("{} (layer {})", describe(EntryProblem::ECacheChecksum), entry.meta.e_layers[j]);
  return std::nullopt;
}

EntryProblem check_entry_mac(std::span<const uint8_t> file, const ParsedEntry& entry,
                             const EntryAuthenticator& auth) {
  if (entry.mac_kind != kMacHmacSha256) return EntryProblem::MissingMac;
  const std::span<const uint8_t> parts[] = {file.first(entry.mac_offset), file.subspan(entry.pages_offset)};
  return auth.verify(parts, entry.mac) ? EntryProblem::Ok : EntryProblem::BadMac;
}

}  // namespace choreo::store
