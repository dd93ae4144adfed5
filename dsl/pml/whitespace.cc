#include "dsl/pml/whitespace.h"

#include "dsl/pml/xml.h"

namespace choreo::dsl::pml {

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string collapse_whitespace(std::string_view text) {
  std::string out;
  bool gap = false;
  for (char c : text) {
    if (is_space(c)) {
      gap = true;
      continue;
    }
    if (gap && !out.empty()) out += ' ';
    gap = false;
    out += c;
  }
  return out;
}

std::optional<Text> Spacing::take(std::string_view raw, size_t* leading_offset) {
  return take_impl(raw, true, leading_offset);
}

std::optional<Text> Spacing::take_literal(std::string_view raw) { return take_impl(raw, false, nullptr); }

bool Spacing::take_pending() {
  bool was = pending_ && !fresh_;
  pending_ = false;
  fresh_ = false;
  return was;
}

std::optional<Text> Spacing::take_impl(std::string_view raw, bool decode, size_t* leading_offset) {
  size_t begin = 0;
  while (begin < raw.size() && is_space(raw[begin])) ++begin;
  if (begin == raw.size()) {
    if (!raw.empty() && !fresh_) pending_ = true;
    return std::nullopt;
  }
  size_t end = raw.size();
  while (end > begin && is_space(raw[end - 1])) --end;
  // Collapse on the raw text, then decode: whitespace written as a reference survives. Literal text (a src=
  // file, e.g. source code) keeps its inner whitespace.
  Text t;
  if (decode) t.text = decode_entities(collapse_whitespace(raw.substr(begin, end - begin)));
  else t.text = std::string(raw.substr(begin, end - begin));
  t.space_before = !fresh_ && (pending_ || begin > 0);
  pending_ = end < raw.size();
  fresh_ = false;
  if (leading_offset) *leading_offset = begin;
  return t;
}

}  // namespace choreo::dsl::pml
