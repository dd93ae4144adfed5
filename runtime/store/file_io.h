#pragma once
// Small POSIX file helpers shared by the store's writers (entries, the marker).

#include <cstddef>
#include <string>

namespace choreo::store {

/// strerror(errno).
std::string errno_text();
/// Writes all `n` bytes (retrying short writes and EINTR); throws RuntimeFailure naming `path`.
void write_all(int fd, const void* data, size_t n, const std::string& path);
/// fsync of a directory, so a rename into it survives a crash; throws RuntimeFailure.
void fsync_dir(const std::string& dir);
/// fsync of a written file; throws RuntimeFailure naming `path`.
void fsync_file(int fd, const std::string& path);
/// Renames `temp` onto `target` in `dir`, atomically replacing whatever is there (a rename never follows a
/// link), then fsyncs `dir`. False, with `temp` left as it is, when a directory holds `target` (a rename
/// cannot replace one); throws RuntimeFailure on any other error.
bool rename_into_place(const std::string& temp, const std::string& target, const std::string& dir);

}  // namespace choreo::store
