#include "common/utf8.h"

#include <cassert>

namespace choreo {

void append_utf8(std::string& out, uint32_t codepoint) {
  assert(codepoint <= 0x10FFFF);
  if (codepoint < 0x80) {
    out.push_back(char(codepoint));
  } else if (codepoint < 0x800) {
    out.push_back(char(0xC0 | (codepoint >> 6)));
    out.push_back(char(0x80 | (codepoint & 0x3F)));
  } else if (codepoint < 0x10000) {
    out.push_back(char(0xE0 | (codepoint >> 12)));
    out.push_back(char(0x80 | ((codepoint >> 6) & 0x3F)));
    out.push_back(char(0x80 | (codepoint & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (codepoint >> 18)));
    out.push_back(char(0x80 | ((codepoint >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((codepoint >> 6) & 0x3F)));
    out.push_back(char(0x80 | (codepoint & 0x3F)));
  }
}

size_t valid_utf8_length(std::string_view s, size_t i) {
  const auto continuation = [](unsigned char c) { return (c & 0xC0) == 0x80; };
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t code = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    code = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    code = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    code = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if (!continuation(d)) return 0;
    code = (code << 6) | (d & 0x3F);
  }
  if ((n == 3 && code < 0x800) || (n == 4 && (code < 0x10000 || code > 0x10FFFF)) ||
      (code >= 0xD800 && code <= 0xDFFF))
    return 0;
  return n;
}

size_t find_invalid_text_byte(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '\0') return i;
    const size_t n = valid_utf8_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace choreo
