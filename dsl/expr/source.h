#pragma once
// Expression text and where it sits in its file, so every error can point at the offending character.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/suggest.h"

namespace choreo::dsl::expr {

/// The text of an expression or template plus the file location of its first character. Offsets into `text`
/// map to file locations: on the first line the column is `start.col + offset`; after a newline in the text,
/// lines count on from `start.line` and columns restart at 1 (the host passes texts whose later lines start
/// at column 1 of the file, or accepts columns relative to the text's own lines).
struct SourceText {
  std::string text;
  SourceLocation start;
  /// Offsets of the '\n's in `text` once index_lines() has run (for long texts such as PML documents, which
  /// ask for many locations): location_at() then takes O(log lines) instead of O(offset).
  std::vector<size_t> newlines;
  /// Characters (UTF-8 lead bytes) before each multiple of kCharBlock bytes, once index_lines() has run: a
  /// column is then counted over at most one block, so locating many offsets on one long line stays linear
  /// (64 bytes: a megabyte of one-line PML with a text node every few bytes located in well under a second).
  std::vector<size_t> chars_before_block;
  static constexpr size_t kCharBlock = 64;
  bool lines_indexed = false;

  /// Fills `newlines` and `chars_before_block` (call before sharing the text).
  void index_lines();
  /// index_lines() for texts longer than kIndexFrom bytes. Parsers call it: free_names() and errors locate every
  /// name, and unindexed that is O(offset) each, quadratic in a long generated expression.
  void index_lines_if_long() {
    if (text.size() > kIndexFrom) index_lines();
  }
  static constexpr size_t kIndexFrom = 512;
  /// The number of characters in text[0, offset).
  size_t chars_before(size_t offset) const;

  /// The file location of the character at `offset` (offset == text.size() is the end of the text).
  SourceLocation location_at(size_t offset) const;
  /// The line of `text` holding `offset`, indented so that a caret at the location's column lines up.
  std::string quoted_line_at(size_t offset) const;
  /// An InputError at `offset` with the line quoted.
  InputError error_at(size_t offset, std::string message, std::string hint = {}) const;
};

/// Shared ownership: an Expr and the errors raised while evaluating it point into the same text.
using SourcePtr = std::shared_ptr<const SourceText>;

// The one "did you mean" of common/suggest.h, under the names expression code has always used.
using choreo::closest_name;
using choreo::with_suggestion;

}  // namespace choreo::dsl::expr
