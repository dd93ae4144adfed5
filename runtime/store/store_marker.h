#pragma once
// The marker file that makes a directory a store (docs/store.md, "The marker"): `gc` and `rm` delete files
// only in a directory that carries it, so a --cache-dir pointed at the wrong place ($HOME, a source tree)
// loses nothing.

#include <optional>
#include <string>
#include <string_view>

namespace choreo::store {

/// The marker's file name, and the first line of its content.
inline constexpr std::string_view kMarkerName = "CHOREO_STORE";
inline constexpr std::string_view kMarkerLine = "choreo encoding store";

enum class MarkerState {
  Absent,   // nothing at the marker's name
  Valid,    // a regular file whose first line is kMarkerLine
  Invalid,  // something else at that name (another file, a symlink, a directory...)
};
MarkerState marker_state(const std::string& dir);

/// True for the names a store itself creates: entries `<16 hex digits>.ckv`, temporary files `.*.tmp`, the
/// lock file `lock`, and the marker.
bool is_store_name(std::string_view name);

/// The first name in `dir` that is not a store name; nullopt when every name is one (or `dir` is empty).
std::optional<std::string> first_foreign_name(const std::string& dir);

/// Creates the marker crash-safely (temporary file, fsync, rename, fsync of the directory). Throws
/// RuntimeFailure on I/O errors.
void write_marker(const std::string& dir);

}  // namespace choreo::store
