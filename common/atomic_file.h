#pragma once
// The one output writer: every file choreo writes (--json, --trace, --out, merge -o, synth -o, store
// entries) goes through the rules here, stated once in docs/limits.md ("Output files"):
//  - a regular file is replaced whole: the new content goes to a temporary file created beside it with an
//    unpredictable name and O_CREAT | O_EXCL | O_NOFOLLOW, then renamed over it, so a reader sees the old
//    file or the new one, and a planted symlink at the temporary name cannot redirect the write;
//  - a character device or FIFO (/dev/null, /dev/stdout, a pipe) is written in place, never replaced;
//  - anything else (a directory, a socket, a block device) and any file of /proc or /sys is refused;
//  - a symbolic link is followed only when it is owned by the user running choreo or by root: a link that
//    another user planted is refused.

#include <string>
#include <string_view>

namespace choreo {

/// Where a write-then-rename of `path` must rename to: a symlink (or a chain of them) is followed, so the link
/// stays a link and its target is replaced. Throws InputError when the path cannot be written under the rules
/// above. `flag` names the option in the message (e.g. "-o").
std::string rename_target(const std::string& path, std::string_view flag);

/// A temporary file created beside `target` (same directory, so a rename is atomic) with an unpredictable
/// name, O_CREAT | O_EXCL | O_NOFOLLOW and mode 0666 less the umask (or `target`'s mode when it exists).
/// Opened write-only, or read-write for a writer that maps it. Removed when the object dies unless committed.
class TemporaryFile {
 public:
  /// Throws RuntimeFailure naming `target` when the file cannot be created.
  explicit TemporaryFile(const std::string& target, bool read_write = false);
  ~TemporaryFile();
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  /// fsync, close and rename over `target` (a rename never follows a symlink there: it replaces it), then
  /// fsync the directory. False, with nothing renamed, when a directory stands at `target` (a rename cannot
  /// replace one). Throws RuntimeFailure on any other failure. The temporary file is removed unless renamed.
  bool publish();
  /// publish(), and a directory at `target` is a RuntimeFailure too.
  void commit();

 private:
  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

/// write(2) until all of `bytes` is written, retrying on EINTR; throws RuntimeFailure naming `path`.
void write_all_or_throw(int fd, std::string_view bytes, const std::string& path);

/// Writes `content` to `path` under the rules above. Throws RuntimeFailure (naming the path) when any step
/// fails; nothing half-written is left at `path` then. Paths that cannot be written are an InputError.
void write_file_atomically(const std::string& path, std::string_view content);

/// Opens `path` for appending (eval --out) under the same rules: a regular file is created or appended to,
/// a FIFO or character device written to, anything else refused. Returns the descriptor (read-write for a
/// regular file, so its end can be read back).
int open_for_append(const std::string& path, std::string_view flag);

/// Throws InputError (exit 2) when `path` cannot be created: its directory is missing or not writable, or
/// the path is refused by the rules above. Commands call this before doing any work, so a typo in an output
/// path costs nothing. Returns true when `path` is written in place (a FIFO or character device).
bool check_writable(const std::string& path, std::string_view flag);

/// write(2) until all of `content` is written, retrying on EINTR. False on an error (errno set).
bool write_all(int fd, std::string_view content);

}  // namespace choreo
