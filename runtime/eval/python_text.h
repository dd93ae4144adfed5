#pragma once
// Python's string semantics, for metrics whose official definitions are Python code: code-point indexing
// of UTF-8 text, str.split() with and without a separator, str.replace, str.lower and str.isspace. The
// metrics mirror the reference scripts rule for rule; these helpers keep the C++ reading like them.

#include <string>
#include <string_view>
#include <vector>

namespace choreo::eval {

/// Bytes of the UTF-8 code point starting at `offset` (1 for an invalid byte), as Python indexes a str.
size_t code_point_bytes(std::string_view text, size_t offset);
/// Number of code points in `text` (Python's len of the str).
size_t code_point_count(std::string_view text);
/// The first code point of `text` as a string (Python's text[0]); empty for empty text.
std::string_view first_code_point(std::string_view text);

/// Python's str.isspace for one code point.
bool is_python_space(char32_t codepoint);
/// Python's str.split() without arguments: runs of whitespace separate, no empty pieces.
std::vector<std::string> split_whitespace(std::string_view text);
/// Python's str.split(separator) (separator non-empty): n separators give n+1 pieces, empty ones included.
std::vector<std::string> split(std::string_view text, std::string_view separator);
/// Python's " ".join(pieces).
std::string join(const std::vector<std::string>& pieces, std::string_view glue);
/// Python's str.replace(from, to): every non-overlapping occurrence, scanning left to right.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);
/// Python's str.lower() with simple (one-to-one) Unicode case mappings.
std::string lower(std::string_view text);

}  // namespace choreo::eval
