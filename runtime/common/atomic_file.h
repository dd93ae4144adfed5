#pragma once
// Writing an output file so that readers see either the old file or the whole new one, never half of it.

#include <string>
#include <string_view>

namespace choreo {

/// Where a write-then-rename of `path` must rename to: a symlink (or a chain of them) is followed, so the link
/// stays a link and its target is replaced. Throws InputError when `path` exists and is not a regular file
/// (a directory, a device such as /dev/null, a FIFO, a socket): renaming over it would replace it, which as
/// root would destroy a device node. `flag` names the option in the message (e.g. "-o").
std::string rename_target(const std::string& path, std::string_view flag);

/// Writes `content` to a temporary file beside `path` (beside its target, for a symlink), flushes it to disk
/// and renames it into place. A character device or FIFO (/dev/null, /dev/stdout, a pipe) is written
/// directly instead, since it cannot be replaced. Throws RuntimeFailure (naming the path) when any step
/// fails; the temporary file is removed then. Other non-regular paths are an InputError (rename_target).
void write_file_atomically(const std::string& path, std::string_view content);

/// Throws InputError (exit 2) when `path` cannot be created: its directory is missing or not writable, or
/// the path is a directory or another file that cannot be written in place or replaced.
/// Commands call this before doing any work, so a typo in an output path costs nothing.
void check_writable(const std::string& path, std::string_view flag);

}  // namespace choreo
