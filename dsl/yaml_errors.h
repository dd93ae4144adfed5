#pragma once
// The YAML-facing half of workflow errors: a line table that turns yaml-cpp marks (byte offsets) into
// 1-based file:line:col, quotes the offending line, suggests near names, and the checks run on raw text
// before yaml-cpp sees it (size, UTF-8, nesting depth) so hostile input becomes an InputError, never a crash.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/suggest.h"

namespace choreo::dsl {

/// The text of a workflow file with its line table; makes every InputError point at a character.
class SourceFile {
 public:
  SourceFile(std::string text, std::string name);

  const std::string& text() const { return text_; }
  const std::string& name() const { return name_; }
  int line_count() const { return static_cast<int>(line_starts_.size()); }

  /// Location of a byte offset: 1-based line and column, columns counting UTF-8 characters.
  SourceLocation at_offset(size_t byte_offset) const;
  /// Byte offset of a location (the inverse of at_offset; clamped to the line).
  size_t offset_of(const SourceLocation& where) const;
  /// The text of a 1-based line without its newline.
  std::string line_text(int line) const;

  /// An InputError at `where`, quoting its line.
  InputError error(const SourceLocation& where, std::string message, std::string hint = {}) const;

 private:
  std::string text_, name_;
  std::vector<size_t> line_starts_;
};

/// Rejects input yaml-cpp should not see: empty, too large, not UTF-8, NUL bytes, or nested too deeply.
void precheck_yaml_text(const SourceFile& file);

}  // namespace choreo::dsl
