#pragma once
// PML schema files → dsl::pml::Schema. Checks everything that needs no model: element and attribute names,
// names unique per scope, unions holding only modules, parameters only inside modules, roles not nested,
// src= files readable. The first problem is thrown as an InputError at its file:line:col.

#include <string>
#include <string_view>

#include "dsl/pml/ast.h"
#include "common/input_file.h"

namespace choreo::dsl::pml {

/// Parses schema text. `file_name` names it in errors; src="..." paths are relative to its directory
/// (to the working directory when `file_name` is empty) and must stay inside it or inside a directory
/// allowed with --allow-path (common/input_file.h; docs/limits.md).
Schema parse_schema(std::string_view text, const std::string& file_name);

/// Reads and parses a schema file (a missing, unreadable or too large file is an InputError). With `bytes`,
/// also hands back the bytes it read (`choreo encode` hashes them for the store tag). `origin` says whether
/// the user named the file or another file did (then only a regular file is read).
Schema load_schema(const std::string& path, std::string* bytes = nullptr, Origin origin = Origin::Named);

/// True for names of the form [A-Za-z_][A-Za-z0-9_.-]*.
bool is_pml_name(std::string_view name);

/// True for "system", "user", "assistant".
bool is_role_tag(std::string_view tag);

}  // namespace choreo::dsl::pml
