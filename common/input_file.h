#pragma once
// Reading the files a user gives choreo, and the files those files name, within bounds (docs/limits.md):
//  - every file's size is checked before it is read, against a documented limit a flag raises;
//  - a file named inside another file (a PML `src=`, a workflow's `pml:`) must stay inside the directory of
//    the file that names it, or inside a directory the user allowed with --allow-path;
//  - JSON-lines files are read a line at a time, each line bounded, never whole.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace choreo {

/// The bounds on what choreo reads. The CLI sets them once, from its global flags, before any work
/// (configure_input_policy); library users and tests get the defaults.
struct InputPolicy {
  static constexpr uint64_t kDefaultWorkflowBytes = uint64_t(4) << 20;  // a workflow is a page or two
  static constexpr uint64_t kDefaultFileBytes = uint64_t(256) << 20;    // schemas, data, results, calls
  /// Workflow YAML files (yaml-cpp needs ~50x a file's size in memory, so they get less).
  uint64_t workflow_bytes = kDefaultWorkflowBytes;
  /// Every other file read whole, and every line of a JSON-lines file.
  uint64_t file_bytes = kDefaultFileBytes;
  /// Directories (canonical) outside which named files may also be read (--allow-path).
  std::vector<std::filesystem::path> allowed_dirs;
};

/// The policy in force.
const InputPolicy& input_policy();
/// Sets the policy (the CLI does this once, before running a command). `--max-input-mib N` sets both byte
/// limits to N MiB; allowed directories must exist (InputError otherwise) and are kept canonical.
void configure_input_policy(uint64_t max_input_mib, const std::vector<std::string>& allowed_dirs);

/// How much of what a file is the reader may see.
enum class Origin {
  Named,    ///< the user named it (command line): FIFOs and character devices (/dev/stdin) may be read
  Referred  ///< another file named it: only regular files are read, never a FIFO or device
};

/// Reads a whole input file. `what` names it in errors ("workflow file", "schema file", ...). The file must
/// exist and not be a directory; its size must be at most `max_bytes` (checked before reading for regular
/// files, while reading for pipes). Errors are InputErrors naming the file, with a hint.
std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes,
                            Origin origin = Origin::Named);

/// Resolves `name`, written in `referrer` (a file), to a path inside the referrer's directory or inside an
/// allowed directory. Relative names are relative to the referrer's directory. Symlinks are resolved before
/// the check, so a link cannot lead out. Throws InputError (`what` names the reference, e.g. "src=") when the
/// path leads elsewhere; the caller adds the location.
std::filesystem::path confine_path(const std::filesystem::path& referrer, const std::string& name,
                                   std::string_view what);
/// True when `path` (resolved) is inside `referrer`'s directory or an allowed directory.
bool path_is_confined(const std::filesystem::path& referrer, const std::filesystem::path& path);

/// Reads a file of lines one at a time, each at most input_policy().file_bytes long, from a regular file,
/// pipe or device. Used by every JSON-lines input, so a file is never held whole in memory.
class LineReader {
 public:
  /// Opens `path` (InputError naming `what` when it cannot be read or is a directory).
  LineReader(const std::string& path, std::string_view what);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  /// The next line without its '\n' (a trailing '\r' is kept); false at the end of the file. A line longer
  /// than the limit is an InputError at path:line.
  bool next(std::string& line);
  /// The 1-based number of the line `next` returned last.
  int line_number() const { return line_number_; }
  /// True when the last line returned was not ended by '\n' (the file ends inside it).
  bool last_line_unterminated() const { return unterminated_; }
  const std::string& path() const { return path_; }

 private:
  bool fill();

  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  size_t begin_ = 0;
  bool eof_ = false;
  bool unterminated_ = false;
  int line_number_ = 0;
};

}  // namespace choreo
