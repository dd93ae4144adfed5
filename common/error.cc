#include "common/error.h"

#include <algorithm>

namespace choreo {

std::string SourceLocation::to_string() const {
  if (file.empty()) return {};
  if (line <= 0) return file;
  if (col <= 0) return fmt::format("{}:{}", file, line);
  return fmt::format("{}:{}:{}", file, line, col);
}

namespace {

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

/// Byte offset where 1-based column `col` starts in `line` (line.size() past its end).
size_t byte_at_column(std::string_view line, int col) {
  size_t i = 0;
  for (int c = 1; c < col && i < line.size(); ++c) {
    ++i;
    while (i < line.size() && is_continuation(line[i])) ++i;
  }
  return i;
}

constexpr std::string_view kEllipsis = "\u2026";

/// `text` with control characters shown as visible ones, one character for one, so columns still count
/// right: C0 controls other than tab and newline as their Unicode "control pictures" (ESC as U+241B), DEL
/// as U+2421, and C1 controls (U+0080..U+009F) as U+FFFD. An error quotes input files, and a file must not
/// be able to send escape sequences to the terminal through an error message.
std::string visible_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) {
      const char32_t picture = c == 0x7f ? 0x2421 : 0x2400 + c;
      out += char(0xE0 | (picture >> 12));
      out += char(0x80 | ((picture >> 6) & 0x3F));
      out += char(0x80 | (picture & 0x3F));
    } else if (c == 0xC2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      out += "\uFFFD";
      ++i;
    } else {
      out += char(c);
    }
  }
  return out;
}

}  // namespace

int column_at_byte(std::string_view line, size_t byte) {
  byte = std::min(byte, line.size());
  int col = 1;
  for (size_t i = 0; i < byte; ++i)
    if (!is_continuation(line[i])) ++col;
  return col;
}

std::string clip_text(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t end = max_bytes;
  while (end > 0 && is_continuation(text[end])) --end;
  return std::string(text.substr(0, end)) + std::string(kEllipsis);
}

QuotedLine quote_line(std::string_view line, int col) {
  constexpr size_t kWidth = 2 * QuotedLine::kQuoteContextBytes;
  if (line.size() <= kWidth) return {std::string(line), col};
  const size_t at = byte_at_column(line, std::max(col, 1));
  // The window [begin, end): kQuoteContextBytes either side of `at`, shifted to keep its width at either end,
  // then narrowed to whole characters (never past `at`, so the located character stays inside).
  size_t begin = std::min(at - std::min(at, QuotedLine::kQuoteContextBytes), line.size() - kWidth);
  size_t end = begin + kWidth;
  while (begin < at && is_continuation(line[begin])) ++begin;
  while (end > at && end < line.size() && is_continuation(line[end])) --end;
  QuotedLine quoted;
  if (begin > 0) quoted.text = kEllipsis;
  quoted.text += line.substr(begin, end - begin);
  if (end < line.size()) quoted.text += kEllipsis;
  if (col > 0) quoted.caret_col = (begin > 0 ? 1 : 0) + column_at_byte(line.substr(begin), at - begin);
  return quoted;
}

static std::string first_line(const std::string& where, const std::string& message) {
  return where.empty() ? message : where + ": " + message;
}

InputError::InputError(std::string message, std::string hint, SourceLocation where,
                       std::string_view quoted_line)
    : std::runtime_error(first_line(where.to_string(), clip_text(message, kMaxMessageBytes))),
      message_(clip_text(message, kMaxMessageBytes)),
      hint_(clip_text(hint, kMaxMessageBytes)),
      where_(std::move(where)),
      quoted_(quote_line(quoted_line, where_.col)) {}

InputError InputError::with_message(std::string message) const {
  InputError e(std::move(message), hint_, where_);
  e.quoted_ = quoted_;
  return e;
}

std::string InputError::render() const {
  std::string out = fmt::format("error: {}\n", visible_controls(what()));
  if (!quoted_.text.empty()) {
    const std::string quoted = visible_controls(quoted_.text);
    out += fmt::format("  | {}\n", quoted);
    if (quoted_.caret_col > 0) {
      // One blank per character before the caret; a tab stays a tab so the caret lines up after it too.
      std::string pad;
      const std::string_view before(quoted.data(), byte_at_column(quoted, quoted_.caret_col));
      for (size_t i = 0; i < before.size(); ++i)
        if (!is_continuation(before[i])) pad += before[i] == '\t' ? '\t' : ' ';
      out += fmt::format("  | {}^\n", pad);
    }
  }
  if (!hint_.empty()) out += fmt::format("hint: {}\n", visible_controls(hint_));
  return out;
}

bool is_input_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InputError&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::string describe_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InputError& e) {
    return e.render();
  } catch (const std::exception& e) {
    return std::string(e.what()) + "\n";
  } catch (...) {
    return "unknown error\n";
  }
}

}  // namespace choreo
