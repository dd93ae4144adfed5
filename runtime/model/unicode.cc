#include "runtime/model/unicode.h"

#include <array>
#include <cassert>

namespace choreo::model {

size_t utf8_sequence_length(uint8_t lead_byte) {
  const uint8_t high = lead_byte >> 4;
  if (high < 0xC) return 1;
  if (high < 0xE) return 2;
  if (high == 0xE) return 3;
  return 4;
}

Utf8Char decode_utf8(std::string_view text, size_t offset) {
  assert(offset < text.size());
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[offset + i]); };
  const auto continuation = [&](size_t i) { return offset + i < text.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t lead = byte(0);
  const Utf8Char invalid{0xFFFD, 1, false};
  if (lead < 0x80) return {lead, 1, true};
  if ((lead & 0x40) == 0) return invalid;  // a stray continuation byte
  if ((lead & 0x20) == 0) {
    if (!continuation(1)) return invalid;
    return {(uint32_t(lead & 0x1F) << 6) | (byte(1) & 0x3F), 2, true};
  }
  if ((lead & 0x10) == 0) {
    if (!continuation(1) || !continuation(2)) return invalid;
    return {(uint32_t(lead & 0x0F) << 12) | (uint32_t(byte(1) & 0x3F) << 6) | (byte(2) & 0x3F), 3, true};
  }
  if ((lead & 0x08) == 0) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return invalid;
    return {(uint32_t(lead & 0x07) << 18) | (uint32_t(byte(1) & 0x3F) << 12) |
                (uint32_t(byte(2) & 0x3F) << 6) | (byte(3) & 0x3F),
            4, true};
  }
  return invalid;
}

static bool is_strict(const Utf8Char& c) {
  if (!c.valid) return false;
  const uint32_t cp = c.codepoint;
  const size_t shortest = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  return shortest == c.n_bytes && !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
}

bool is_strict_utf8(std::string_view text) {
  for (size_t offset = 0; offset < text.size();) {
    if (static_cast<uint8_t>(text[offset]) < 0x80) {
      ++offset;
      continue;
    }
    const Utf8Char c = decode_utf8(text, offset);
    if (!is_strict(c)) return false;
    offset += c.n_bytes;
  }
  return true;
}

namespace {

// GPT-2 keeps printable Latin-1 bytes as themselves and moves the other 68 bytes to U+0100 onwards,
// in byte order, so that every byte has a visible, non-space stand-in.
struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 324> from_codepoint;  // every mapped code point is < 256 + 68

  ByteMap() {
    from_codepoint.fill(-1);
    int next_shifted = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable =
          (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
      const uint32_t codepoint = printable ? uint32_t(byte) : uint32_t(256 + next_shifted++);
      append_utf8(to_unicode[byte], codepoint);
      from_codepoint[codepoint] = int16_t(byte);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

std::string_view byte_to_unicode(uint8_t byte) { return byte_map().to_unicode[byte]; }

int unicode_to_byte(uint32_t codepoint) {
  const auto& table = byte_map().from_codepoint;
  return codepoint < table.size() ? table[codepoint] : -1;
}

}  // namespace choreo::model
