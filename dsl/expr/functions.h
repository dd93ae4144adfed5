#pragma once
// The fixed function library (range, len, majority, regex_match, json, boxed, join, ...). Nothing else can be
// called: there are no user functions, methods, lambdas or host calls. Semantics in docs/expressions.md.

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/expr/value.h"

namespace choreo::dsl::expr {

class Context;

/// What the parser checks about a call before evaluation: the name and the number of arguments.
struct FunctionInfo {
  std::string_view name;
  int min_args = 0;
  int max_args = 0;            ///< -1: any number
  std::string_view arity;      ///< "1 argument", "1 to 3 arguments", ...
  std::string_view signature;  ///< "range(stop) or range(start, stop[, step])"
};

/// The library function called `name`, or nullptr.
const FunctionInfo* find_function(std::string_view name);

/// Every library function name, sorted.
std::span<const std::string> function_names();

/// Calls a library function on evaluated arguments. `call_offset` is the function name's position and
/// `argument_offsets` the positions of the arguments (errors about one argument point at it).
Value call_function(const FunctionInfo& function, std::span<const Value> arguments, Context& context,
                    size_t call_offset, std::span<const size_t> argument_offsets);

/// The contents of the last `\boxed{...}` or `\fbox{...}` in `text` with braces matched, or nullopt when there
/// is none or its braces never close. (The answer-extraction rule of the MATH benchmark.)
std::optional<std::string> last_boxed(std::string_view text);

}  // namespace choreo::dsl::expr
