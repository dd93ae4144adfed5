#pragma once
// Writing an output file so that readers see either the old file or the whole new one, never half of it.

#include <string>
#include <string_view>

namespace choreo {

/// Writes `content` to a temporary file beside `path`, flushes it to disk and renames it over `path`.
/// Throws RuntimeFailure (naming the path) when any step fails; the temporary file is removed then.
void write_file_atomically(const std::string& path, std::string_view content);

/// Throws InputError (exit 2) when `path` cannot be created: its directory is missing or not writable.
/// Commands call this before doing any work, so a typo in an output path costs nothing.
void check_writable(const std::string& path, std::string_view flag);

}  // namespace choreo
