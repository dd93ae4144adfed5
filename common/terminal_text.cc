#include "common/terminal_text.h"

#include <fmt/format.h>

#include <cstdint>

namespace choreo {

namespace {

/// What the bytes at the start of `s` are.
struct Sequence {
  enum Kind { Valid, Invalid, Unfinished } kind;
  size_t length = 1;       // bytes of a valid sequence
  uint32_t codepoint = 0;  // of a valid sequence
};

/// Reads one UTF-8 sequence at the start of `s` (not empty). Strict: no overlong forms, no surrogates,
/// nothing past U+10FFFF. A valid beginning cut off by the end of `s` is Unfinished.
Sequence read_sequence(std::string_view s) {
  const auto lead = static_cast<unsigned char>(s[0]);
  if (lead < 0x80) return {Sequence::Valid, 1, lead};
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return {Sequence::Invalid};
  }
  uint32_t codepoint = lead & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if (k >= s.size()) return {Sequence::Unfinished};
    const auto c = static_cast<unsigned char>(s[k]);
    if (c < (k == 1 ? low : 0x80) || c > (k == 1 ? high : 0xBF)) return {Sequence::Invalid};
    codepoint = (codepoint << 6) | (c & 0x3F);
  }
  return {Sequence::Valid, n, codepoint};
}

/// The Unicode bidirectional controls (LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI; LRM, RLM, ALM): they
/// reorder what a terminal shows, so model text could make the line it prints read differently from its
/// bytes ("Trojan Source", CVE-2021-42574).
bool is_bidi_control(uint32_t c) {
  return (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || c == 0x200E || c == 0x200F ||
         c == 0x061C;
}

/// Escapes `text`; stops before an unfinished sequence at its end unless `at_end`, and returns where it
/// stopped.
size_t escape_into(std::string& out, std::string_view text, bool at_end) {
  size_t i = 0;
  while (i < text.size()) {
    const Sequence seq = read_sequence(text.substr(i));
    if (seq.kind == Sequence::Unfinished && !at_end) break;
    if (seq.kind != Sequence::Valid) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    const uint32_t c = seq.codepoint;
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F)
      out += fmt::format("\\x{:02x}", c);
    else if ((c >= 0x80 && c <= 0x9F) || is_bidi_control(c))
      out += fmt::format("\\u{:04x}", c);
    else
      out.append(text.substr(i, seq.length));
    i += seq.length;
  }
  return i;
}

}  // namespace

std::string TerminalEscaper::feed(std::string_view piece) {
  held_.append(piece);
  std::string out;
  held_.erase(0, escape_into(out, held_, /*at_end=*/false));
  return out;
}

std::string TerminalEscaper::finish() {
  std::string out;
  escape_into(out, held_, /*at_end=*/true);
  held_.clear();
  return out;
}

std::string escape_for_terminal(std::string_view text) {
  std::string out;
  escape_into(out, text, /*at_end=*/true);
  return out;
}

}  // namespace choreo
