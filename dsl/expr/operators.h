#pragma once
// The operators of the language on values: arithmetic, comparison, membership, indexing and slicing.
// Internal to dsl/expr; the rules are documented in docs/expressions.md.

#include <compare>
#include <string_view>
#include <vector>

#include "dsl/expr/ast.h"
#include "dsl/expr/context.h"

namespace choreo::dsl::expr {

/// Applies an arithmetic, comparison or membership operator; `offset` is the operator's position.
Value apply_binary(Op op, const Value& left, const Value& right, Context& context, size_t offset);

/// Orders two values for <, sorted(), min() and max(): numbers with numbers, texts with texts (bytewise),
/// bools with bools, lists element-wise. Anything else is a type error naming both types. NaN is unordered.
std::partial_ordering compare_values(const Value& left, const Value& right, Context& context, size_t offset,
                                     std::string_view what);

/// `object[index]`; `offset` points at the index expression.
Value index_value(const Value& object, const Value& index, Context& context, size_t offset);

/// `object[start:stop]` with Python's clamping; null bounds mean the ends.
Value slice_value(const Value& object, const Value& start, const Value& stop, Context& context, size_t offset);

/// Byte offsets where each UTF-8 character of `text` starts (stray continuation bytes join the character
/// before them), plus text.size() at the end.
std::vector<size_t> character_starts(std::string_view text);

}  // namespace choreo::dsl::expr
