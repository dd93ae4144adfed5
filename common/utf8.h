#pragma once
// UTF-8 encoding of one code point: the one encoder that the tokenizer (runtime/model), the PML reader's
// character references (dsl/pml) and the expression lexer's \u escapes (dsl/expr) share; and the one check of
// the text files choreo reads (workflow YAML, PML schemas and their src= files).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace choreo {

/// Appends the UTF-8 encoding of `codepoint` (must be <= 0x10FFFF; surrogates are encoded as given).
void append_utf8(std::string& out, uint32_t codepoint);

/// The length of the valid UTF-8 sequence at s[i], or 0 when none starts there (overlong forms, surrogates
/// and values past U+10FFFF are not UTF-8).
size_t valid_utf8_length(std::string_view s, size_t i);

/// The offset of the first byte of `text` that a text file may not hold: a NUL, or one that starts no valid
/// UTF-8 sequence. npos when there is none.
size_t find_invalid_text_byte(std::string_view text);

}  // namespace choreo
