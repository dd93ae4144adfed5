#pragma once
// UTF-8 encoding of one code point: the one encoder that the tokenizer (runtime/model), the PML reader's
// character references (dsl/pml) and the expression lexer's \u escapes (dsl/expr) share.

#include <cstdint>
#include <string>

namespace choreo {

/// Appends the UTF-8 encoding of `codepoint` (must be <= 0x10FFFF; surrogates are encoded as given).
void append_utf8(std::string& out, uint32_t codepoint);

}  // namespace choreo
