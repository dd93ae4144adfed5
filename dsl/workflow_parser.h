#pragma once
// Workflow files → checked AST (dsl/workflow.h). Reads YAML with yaml-cpp, types every scalar by the schema
// (not by YAML's guessing), and runs the checks that need no expression evaluated: unknown or duplicate keys,
// wrong node kinds, missing keys, names, parents referring to earlier definitions, agents of private
// messages, loop headers. The first problem found is thrown as an InputError pointing at its line and column.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/workflow.h"

namespace choreo::dsl {

/// Parses workflow text; `file_name` is used in error locations and stored in the AST.
Workflow parse_workflow(std::string_view text, const std::string& file_name);

/// Reads and parses a workflow file (a missing or unreadable file is an InputError too).
Workflow load_workflow(const std::string& path);

/// The parts of a `NAME in EXPR` loop header, with their byte offsets in the header text.
struct LoopHeader {
  std::string variable;
  size_t variable_offset = 0;
  std::string iterable;
  size_t iterable_offset = 0;
};

/// Splits `NAME in EXPR`; nullopt if the text has another form.
std::optional<LoopHeader> split_loop_header(std::string_view text);

/// The names bound by the ` for NAME in ` clauses of a comprehension, in order (empty: not a comprehension).
std::vector<std::string> comprehension_variables(std::string_view text);

/// Where the character at byte `offset` of `text.value` is in the file. Exact for one-line plain and quoted
/// scalars without escapes and for `|` blocks; for folded or escaped text it is the nearest estimate.
SourceLocation locate(const Text& text, size_t offset);

}  // namespace choreo::dsl
