#pragma once
// Typing a workflow's inputs and params for one run: the file's declarations and defaults, overridden by
// `--input k=v` / `--param k=v` text converted to the declared type.

#include <map>
#include <string>
#include <string_view>

#include "dsl/arguments.h"
#include "dsl/expr/value.h"
#include "dsl/workflow.h"
#include "runtime/exec/interpreter.h"

namespace choreo::exec {

using dsl::convert_argument;
using dsl::literal_value;

/// Every input and param of `workflow` with its value for this run. An input without a value, a key the
/// workflow does not declare, or a value of the wrong type is an InputError naming the key. Inputs may also
/// name a `field:` of a message (its value is used verbatim).
std::map<std::string, dsl::expr::Value, std::less<>> bind_arguments(const dsl::Workflow& workflow,
                                                                    const RunArguments& arguments);

}  // namespace choreo::exec
