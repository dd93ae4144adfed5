#pragma once
// Typed values from text: command-line `--input`/`--param` text converted to a declared type, and the value
// of a parameter default as written in a workflow file. Used by the interpreter and by `choreo check`.

#include <string>
#include <string_view>

#include "dsl/expr/value.h"
#include "dsl/workflow.h"

namespace choreo::dsl {

/// The word for a declared type in messages: "string", "int", "float", "bool", "list".
std::string_view value_type_name(ValueType type);

/// Converts command-line text to a value of `type`; `what` names it in errors ("input `n`").
/// Throws InputError for text that is not a value of that type.
expr::Value convert_argument(std::string_view text, ValueType type, const std::string& what);

/// The value of a parameter default as written in the file.
expr::Value literal_value(const Literal& literal);

}  // namespace choreo::dsl
