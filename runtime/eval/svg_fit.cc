#include "runtime/eval/svg_fit.h"

#include <algorithm>

namespace choreo::eval {

namespace {

/// The advance of the character starting `c` (its lead byte), in ems, rounded up from DejaVu Sans Bold's.
double char_width_em(unsigned char c) {
  if (c >= 0x80) return 1.0;  // any other script: as wide as an em
  if (c == ' ') return 0.36;
  if (std::string_view("ijl'|!.,:;").find(char(c)) != std::string_view::npos) return 0.42;
  if (std::string_view("frt()[]{}-/\\\"`").find(char(c)) != std::string_view::npos) return 0.56;
  if (c == 'm' || c == 'w') return 1.06;
  if (c == 'M' || c == 'W') return 1.12;
  if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') return 0.73;
  if (c >= 'A' && c <= 'Z') return 0.86;
  return 1.0;  // symbols such as % & @ #
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

double estimated_text_width_px(std::string_view text, double font_px) {
  double ems = 0;
  for (const char c : text)
    if (!is_continuation(static_cast<unsigned char>(c))) ems += char_width_em(static_cast<unsigned char>(c));
  return ems * font_px;
}

std::vector<std::string> wrap_to_width(std::string_view text, double font_px, double max_width_px) {
  std::vector<std::string> lines(1);
  const auto fits = [&](std::string_view candidate) {
    return estimated_text_width_px(candidate, font_px) <= max_width_px;
  };
  size_t at = 0;
  while (at < text.size()) {
    if (text[at] == ' ') {
      ++at;
      continue;
    }
    const size_t end = std::min(text.find(' ', at), text.size());
    std::string_view word = text.substr(at, end - at);
    at = end;
    const std::string joined =
        lines.back().empty() ? std::string(word) : lines.back() + " " + std::string(word);
    if (fits(joined)) {
      lines.back() = joined;
      continue;
    }
    if (!lines.back().empty()) lines.emplace_back();
    // A word wider than a line is cut between characters, never inside one.
    while (!fits(word)) {
      size_t cut = 0;
      for (size_t next = 1; next <= word.size(); ++next) {
        if (next < word.size() && is_continuation(static_cast<unsigned char>(word[next]))) continue;
        if (!fits(word.substr(0, next))) break;
        cut = next;
      }
      if (cut == 0) cut = 1;  // not even one character fits: one a line
      while (cut < word.size() && is_continuation(static_cast<unsigned char>(word[cut]))) ++cut;
      lines.back() = std::string(word.substr(0, cut));
      lines.emplace_back();
      word.remove_prefix(cut);
    }
    lines.back() = std::string(word);
  }
  if (lines.size() > 1 && lines.back().empty()) lines.pop_back();
  return lines;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') ? ' ' : c;
    }
  }
  return out;
}

}  // namespace choreo::eval
