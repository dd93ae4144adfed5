#pragma once
// Parses expression text into an Expr. Precedence, lowest first (see docs/expressions.md):
//   x if c else y  <  or  <  and  <  not  <  comparisons, in, not in  <  + -  <  * / // %  <  unary - +
//   <  **  <  x.name  x[i]  x[i:j]  f(...)
// A top-level `e for x in xs if c` (no brackets) is a comprehension and evaluates to a list.

#include <string_view>

#include "dsl/expr/ast.h"
#include "common/error.h"

namespace choreo::dsl::expr {

/// Bounds that keep parsing (and later evaluation, which recurses over the tree) off the stack limit.
struct ParseLimits {
  int max_nesting = kMaxValueDepth;  ///< brackets, parentheses and unary operators nested inside each other
  int max_height = 256;              ///< height of the syntax tree (long operator chains count too)
  size_t max_bytes = 1 << 20;        ///< expression text length
};

/// Parses a bare expression; `location` is where its first character sits in its file. Throws InputError.
Expr parse_expression(std::string_view text, const SourceLocation& location, const ParseLimits& limits = {});

/// Parses `source->text[begin, end)` (used for the `{{ }}` parts of a template, so errors quote the template).
Expr parse_expression_in(SourcePtr source, size_t begin, size_t end, const ParseLimits& limits = {});

}  // namespace choreo::dsl::expr
