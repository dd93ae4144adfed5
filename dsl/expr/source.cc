#include "dsl/expr/source.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace choreo::dsl::expr {

void SourceText::index_lines() {
  newlines.clear();
  for (size_t i = text.find('\n'); i != std::string::npos; i = text.find('\n', i + 1)) newlines.push_back(i);
  chars_before_block.assign(1, 0);
  for (size_t block = 0; block + kCharBlock <= text.size(); block += kCharBlock)
    chars_before_block.push_back(chars_before_block.back() +
                                 size_t(column_at_byte(std::string_view(text).substr(block, kCharBlock), kCharBlock) - 1));
  lines_indexed = true;
}

size_t SourceText::chars_before(size_t offset) const {
  if (!lines_indexed) return size_t(column_at_byte(text, offset) - 1);
  const size_t block = offset / kCharBlock;
  const size_t begin = block * kCharBlock;
  return chars_before_block[block] + size_t(column_at_byte(std::string_view(text).substr(begin), offset - begin) - 1);
}

SourceLocation SourceText::location_at(size_t offset) const {
  offset = std::min(offset, text.size());
  SourceLocation where = start;
  size_t line_start = 0;
  size_t before = 0;  // newlines before offset
  if (lines_indexed) {
    before = size_t(std::lower_bound(newlines.begin(), newlines.end(), offset) - newlines.begin());
    if (before > 0) line_start = newlines[before - 1] + 1;
  } else {
    for (size_t i = 0; i < offset; ++i) {
      if (text[i] == '\n') {
        ++before;
        line_start = i + 1;
      }
    }
  }
  // Columns count characters, as SourceLocation's do.
  const int col_in_line = lines_indexed ? int(chars_before(offset) - chars_before(line_start)) + 1
                                        : column_at_byte(std::string_view(text).substr(line_start), offset - line_start);
  if (before == 0) {
    where.col = std::max(start.col, 1) + col_in_line - 1;
  } else {
    where.line = start.line + int(before);
    where.col = col_in_line;
  }
  if (start.line <= 0) where.line = 0;  // unknown line: keep only the column relative to the text
  return where;
}

std::string SourceText::quoted_line_at(size_t offset) const {
  offset = std::min(offset, text.size());
  size_t begin = offset;
  while (begin > 0 && text[begin - 1] != '\n') --begin;
  size_t end = text.find('\n', begin);
  if (end == std::string::npos) end = text.size();
  std::string line = text.substr(begin, end - begin);
  for (char& c : line)
    if (c == '\t' || c == '\r') c = ' ';  // keep the caret aligned
  // On the text's first line, indent by the start column so the caret under location_at(...).col lines up.
  if (begin == 0 && start.col > 1) line.insert(0, static_cast<size_t>(start.col - 1), ' ');
  return line;
}

InputError SourceText::error_at(size_t offset, std::string message, std::string hint) const {
  return InputError(std::move(message), std::move(hint), location_at(offset), quoted_line_at(offset));
}

}  // namespace choreo::dsl::expr
