#include "runtime/eval/python_text.h"

#include <locale.h>

#include <clocale>
#include <cwctype>

#include "runtime/model/unicode.h"

namespace choreo::eval {

size_t code_point_bytes(std::string_view text, size_t offset) {
  return model::decode_utf8(text, offset).n_bytes;
}

size_t code_point_count(std::string_view text) {
  size_t n = 0;
  for (size_t k = 0; k < text.size(); k += code_point_bytes(text, k)) ++n;
  return n;
}

std::string_view first_code_point(std::string_view text) {
  if (text.empty()) return text;
  return text.substr(0, code_point_bytes(text, 0));
}

bool is_python_space(char32_t c) {
  // Python's whitespace: bidirectional classes WS, B, S and category Zs.
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return true;
  if (c < 0x80) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<std::string> split_whitespace(std::string_view text) {
  std::vector<std::string> out;
  std::string piece;
  bool in_piece = false;
  for (size_t k = 0; k < text.size();) {
    const model::Utf8Char c = model::decode_utf8(text, k);
    const bool space = c.valid && is_python_space(c.codepoint);
    if (space) {
      if (in_piece) out.push_back(std::move(piece));
      piece.clear();
      in_piece = false;
    } else {
      piece.append(text.substr(k, c.n_bytes));
      in_piece = true;
    }
    k += c.n_bytes;
  }
  if (in_piece) out.push_back(std::move(piece));
  return out;
}

std::vector<std::string> split(std::string_view text, std::string_view separator) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at = text.find(separator); at != std::string_view::npos; at = text.find(separator, start)) {
    out.emplace_back(text.substr(start, at - start));
    start = at + separator.size();
  }
  out.emplace_back(text.substr(start));
  return out;
}

std::string join(const std::vector<std::string>& pieces, std::string_view glue) {
  std::string out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i) out.append(glue);
    out.append(pieces[i]);
  }
  return out;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  size_t start = 0;
  for (size_t at = text.find(from); at != std::string_view::npos; at = text.find(from, start)) {
    out.append(text.substr(start, at - start));
    out.append(to);
    start = at + from.size();
  }
  out.append(text.substr(start));
  return out;
}

namespace {

/// glibc's C.UTF-8 case tables, held in a locale object of our own so no global locale is touched.
locale_t utf8_locale() {
  static locale_t locale = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    return l ? l : newlocale(LC_CTYPE_MASK, "C", static_cast<locale_t>(nullptr));
  }();
  return locale;
}

}  // namespace

std::string lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t k = 0; k < text.size();) {
    const model::Utf8Char c = model::decode_utf8(text, k);
    if (c.codepoint < 0x80) {
      const char ascii = static_cast<char>(c.codepoint);
      out.push_back(ascii >= 'A' && ascii <= 'Z' ? static_cast<char>(ascii - 'A' + 'a') : ascii);
    } else if (!c.valid) {
      out.append(text.substr(k, c.n_bytes));
    } else {
      const wint_t mapped = towlower_l(static_cast<wint_t>(c.codepoint), utf8_locale());
      model::append_utf8(out, static_cast<uint32_t>(mapped));
    }
    k += c.n_bytes;
  }
  return out;
}

}  // namespace choreo::eval
