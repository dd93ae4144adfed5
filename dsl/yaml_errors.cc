#include "dsl/yaml_errors.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/input_file.h"
#include "common/utf8.h"

namespace choreo::dsl {

namespace {

constexpr int kMaxFlowDepth = 64;           // yaml-cpp recurses per level; keep far from the stack's end
constexpr int kMaxIndentColumns = 256;      // block nesting needs one column per level at least

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

SourceFile::SourceFile(std::string text, std::string name) : text_(std::move(text)), name_(std::move(name)) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i) {
    if (text_[i] == '\n') line_starts_.push_back(i + 1);
  }
}

SourceLocation SourceFile::at_offset(size_t byte_offset) const {
  byte_offset = std::min(byte_offset, text_.size());
  auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), byte_offset);
  size_t line_index = static_cast<size_t>(it - line_starts_.begin()) - 1;
  int col = 1;
  for (size_t i = line_starts_[line_index]; i < byte_offset; ++i) {
    if (!is_continuation(static_cast<unsigned char>(text_[i]))) ++col;
  }
  return SourceLocation{name_, static_cast<int>(line_index) + 1, col};
}

size_t SourceFile::offset_of(const SourceLocation& where) const {
  if (where.line <= 0) return 0;
  if (where.line > line_count()) return text_.size();
  size_t i = line_starts_[where.line - 1];
  for (int col = 1; col < where.col && i < text_.size() && text_[i] != '\n';) {
    ++i;
    while (i < text_.size() && is_continuation(static_cast<unsigned char>(text_[i]))) ++i;
    ++col;
  }
  return i;
}

std::string SourceFile::line_text(int line) const {
  if (line <= 0 || line > line_count()) return {};
  size_t start = line_starts_[line - 1];
  size_t end = text_.find('\n', start);
  std::string out = text_.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (!out.empty() && out.back() == '\r') out.pop_back();
  return out;
}

InputError SourceFile::error(const SourceLocation& where, std::string message, std::string hint) const {
  return InputError(std::move(message), std::move(hint), where, line_text(where.line));
}

void precheck_yaml_text(const SourceFile& file) {
  const std::string& s = file.text();
  // A workflow is a page or two; the limit (4 MiB unless --max-input-mib says otherwise) is hostile, not long.
  const uint64_t max_bytes = input_policy().workflow_bytes;
  if (s.size() > max_bytes) {
    throw InputError(fmt::format("workflow file is too large ({} bytes)", s.size()),
                     fmt::format("workflow files are limited to {} bytes; --max-input-mib N raises it", max_bytes),
                     SourceLocation{file.name(), 0, 0});
  }
  if (s.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw InputError("workflow file is empty", "a workflow needs at least `name:` and `steps:`",
                     SourceLocation{file.name(), 0, 0});
  }
  int flow_depth = 0;
  int indent = 0;
  bool at_line_start = true;
  for (size_t i = 0; i < s.size();) {
    char c = s[i];
    if (c == '\0') {
      throw file.error(file.at_offset(i), "NUL byte in workflow file", "is this a binary file?");
    }
    size_t n = valid_utf8_length(s, i);
    if (n == 0) {
      throw file.error(file.at_offset(i),
                       fmt::format("invalid UTF-8 byte 0x{:02X}", static_cast<unsigned char>(c)),
                       "workflow files must be UTF-8 encoded; re-save the file as UTF-8");
    }
    if (c == '\n') {
      at_line_start = true;
      indent = 0;
    } else if (at_line_start && (c == ' ' || (c == '-' && i + 1 < s.size() && s[i + 1] == ' '))) {
      // "- - - x" nests sequences on one line, so dashes count like indentation.
      if (++indent > kMaxIndentColumns) {
        throw file.error(
            file.at_offset(i), "line is indented or nested too deeply",
            fmt::format("workflow files allow at most {} columns of indentation", kMaxIndentColumns));
      }
    } else {
      at_line_start = false;
    }
    if (c == '[' || c == '{') {
      if (++flow_depth > kMaxFlowDepth) {
        throw file.error(file.at_offset(i), "brackets are nested too deeply",
                         fmt::format("workflow files allow at most {} nested [ ] or {{ }}", kMaxFlowDepth));
      }
    } else if ((c == ']' || c == '}') && flow_depth > 0) {
      --flow_depth;
    }
    i += n;
  }
}

}  // namespace choreo::dsl
