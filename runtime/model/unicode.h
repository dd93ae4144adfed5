#pragma once
// UTF-8 helpers shared by the tokenizers: llama.cpp-compatible (lenient) decoding, encoding, and GPT-2's
// byte <-> printable-unicode mapping used by byte-level BPE vocabularies.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace choreo::model {

/// One code point read from UTF-8 text.
struct Utf8Char {
  uint32_t codepoint = 0;
  size_t n_bytes = 1;
  bool valid = true;  // false: an invalid byte, reported as U+FFFD and consuming one byte
};

/// Bytes of the UTF-8 sequence a lead byte announces (1..4), judged from its high nibble only, as
/// SentencePiece and llama.cpp split text into characters (continuation bytes count as 1).
size_t utf8_sequence_length(uint8_t lead_byte);

/// Decodes the code point at `offset` with llama.cpp's rules: a malformed or truncated sequence yields
/// U+FFFD for its first byte only. Overlong forms and surrogates are accepted as code points, as llama.cpp
/// does.
Utf8Char decode_utf8(std::string_view text, size_t offset);

using choreo::append_utf8;  // common/utf8.h

/// True when `text` is UTF-8 that PCRE2 accepts (no overlongs, surrogates or code points past U+10FFFF).
bool is_strict_utf8(std::string_view text);

/// GPT-2's reversible byte -> printable character map (e.g. ' ' -> "Ġ"), as UTF-8.
std::string_view byte_to_unicode(uint8_t byte);

/// Inverse of byte_to_unicode for one code point; -1 when the code point is not in the map.
int unicode_to_byte(uint32_t codepoint);

}  // namespace choreo::model
