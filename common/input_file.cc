#include "common/input_file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace choreo {

namespace fs = std::filesystem;

namespace {

InputPolicy& mutable_policy() {
  static InputPolicy policy;
  return policy;
}

std::string mib_text(uint64_t bytes) {
  return bytes % (uint64_t(1) << 20) == 0 ? fmt::format("{} MiB", bytes >> 20)
                                          : fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20));
}

[[noreturn]] void too_large(const std::string& path, std::string_view what, uint64_t max_bytes,
                            std::string_view size_text) {
  throw InputError(fmt::format("{} '{}' is {}; input files are limited to {}", what, path, size_text,
                               mib_text(max_bytes)),
                   "raise the limit with --max-input-mib N (docs/limits.md)", SourceLocation{path, 0, 0});
}

/// Waits until the FIFO open as `fd` has something to read: data, or the end of what a writer wrote. Until a
/// writer connects, read() returns 0 as at the end of a file, so a FIFO named before its writer ran read as
/// empty; poll() tells the two apart (Linux reports POLLHUP on a FIFO only after a writer came and went since
/// it was opened). Like cat, it waits as long as it takes, and says so after a second.
void wait_for_writer(int fd, const std::string& path, std::string_view what) {
  pollfd p{fd, POLLIN, 0};
  bool said = false;
  for (;;) {
    const int n = ::poll(&p, 1, said ? -1 : 1000);
    if (n > 0) return;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InputError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)), {},
                       SourceLocation{path, 0, 0});
    std::fprintf(stderr, "choreo: waiting for a writer to open %.*s '%s' (a named pipe)\n", int(what.size()),
                 what.data(), path.c_str());
    said = true;
  }
}

/// Opens `path` for reading without blocking on a FIFO that has no writer yet, and without reading a
/// directory; the returned descriptor blocks again (a named pipe given on the command line is read as a
/// stream, once its writer has connected). `st` receives the file's status.
int open_input(const std::string& path, std::string_view what, Origin origin, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT)
      throw InputError(fmt::format("{} '{}' does not exist", what, path), "check the path",
                       SourceLocation{path, 0, 0});
    throw InputError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(e)), "check the path",
                     SourceLocation{path, 0, 0});
  }
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw InputError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(e)), {},
                     SourceLocation{path, 0, 0});
  }
  const bool regular = S_ISREG(st.st_mode);
  const bool stream = S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode);
  if (!regular && !(stream && origin == Origin::Named)) {
    ::close(fd);
    throw InputError(fmt::format("{} '{}' is {}, not a file", what, path,
                                 S_ISDIR(st.st_mode) ? "a directory" : "a special file"),
                     "give the path of a regular file", SourceLocation{path, 0, 0});
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  // A pipe (`<(...)`, /dev/stdin from a shell pipeline) was made with its writer; a named FIFO may not have
  // one yet.
  constexpr long kPipeFsMagic = 0x50495045;  // PIPEFS_MAGIC in <linux/magic.h>: an anonymous pipe
  struct statfs fs_info;
  if (S_ISFIFO(st.st_mode) && !(::fstatfs(fd, &fs_info) == 0 && long(fs_info.f_type) == kPipeFsMagic)) {
    try {
      wait_for_writer(fd, path, what);
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  return fd;
}

/// read(2) that retries on EINTR; throws InputError naming the file on other errors.
ssize_t read_some(int fd, char* data, size_t n, const std::string& path, std::string_view what) {
  for (;;) {
    const ssize_t got = ::read(fd, data, n);
    if (got >= 0) return got;
    if (errno == EINTR) continue;
    throw InputError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)), {},
                     SourceLocation{path, 0, 0});
  }
}

}  // namespace

const InputPolicy& input_policy() { return mutable_policy(); }

void configure_input_policy(uint64_t max_input_mib, const std::vector<std::string>& allowed_dirs) {
  InputPolicy policy;
  if (max_input_mib > 0) {
    if (max_input_mib > (uint64_t(1) << 24))
      throw InputError(fmt::format("--max-input-mib {} is more than 16 TiB", max_input_mib));
    policy.workflow_bytes = policy.file_bytes = max_input_mib << 20;
  }
  for (const std::string& dir : allowed_dirs) {
    std::error_code ec;
    fs::path canonical = fs::canonical(dir, ec);
    if (ec || !fs::is_directory(canonical, ec))
      throw InputError(fmt::format("--allow-path {}: not an existing directory", dir),
                       "name a directory that files may be read from");
    policy.allowed_dirs.push_back(std::move(canonical));
  }
  mutable_policy() = std::move(policy);
}

std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes,
                            Origin origin) {
  struct stat st;
  const int fd = open_input(path, what, origin, st);
  std::string text;
  try {
    if (S_ISREG(st.st_mode)) {
      if (uint64_t(st.st_size) > max_bytes) too_large(path, what, max_bytes, mib_text(uint64_t(st.st_size)));
      text.resize(size_t(st.st_size));
      size_t got = 0;
      while (got < text.size()) {
        const ssize_t n = read_some(fd, text.data() + got, text.size() - got, path, what);
        if (n == 0) break;  // the file shrank while we read it
        got += size_t(n);
      }
      text.resize(got);
    }
    // Pipes, devices and files that grew (or report no size, as in /proc) are read up to one byte past the
    // limit, which tells "exactly the limit" from "more".
    char chunk[1 << 16];
    for (;;) {
      const ssize_t n = read_some(fd, chunk, sizeof chunk, path, what);
      if (n == 0) break;
      if (text.size() + size_t(n) > max_bytes) too_large(path, what, max_bytes, "larger than that");
      text.append(chunk, size_t(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return text;
}

bool path_is_confined(const fs::path& referrer, const fs::path& path) {
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) return false;
  auto inside = [&](const fs::path& dir) {
    auto d = dir.begin(), r = resolved.begin();
    for (; d != dir.end(); ++d, ++r)
      if (r == resolved.end() || *d != *r) return false;
    return true;
  };
  fs::path home = referrer.parent_path();
  if (home.empty()) home = ".";
  const fs::path home_resolved = fs::weakly_canonical(fs::absolute(home, ec), ec);
  if (!ec && inside(home_resolved)) return true;
  for (const fs::path& dir : input_policy().allowed_dirs)
    if (inside(dir)) return true;
  return false;
}

fs::path confine_path(const fs::path& referrer, const std::string& name, std::string_view what) {
  fs::path path(name);
  if (path.is_relative()) path = referrer.parent_path() / path;  // as written when the referrer has no directory
  if (!path_is_confined(referrer, path))
    throw InputError(
        fmt::format("{}\"{}\" leads outside the directory of {}", what, name, referrer.filename().string()),
        "files named inside a file must be in its directory or below it; allow another directory with "
        "--allow-path DIR (docs/limits.md)");
  return path;
}

LineReader::LineReader(const std::string& path, std::string_view what) : path_(path) {
  struct stat st;
  fd_ = open_input(path, what, Origin::Named, st);
}

LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool LineReader::fill() {
  if (eof_) return false;
  if (begin_ > 0) {
    buffer_.erase(0, begin_);
    begin_ = 0;
  }
  const size_t old = buffer_.size();
  buffer_.resize(old + (1 << 16));
  const ssize_t n = read_some(fd_, buffer_.data() + old, 1 << 16, path_, "file");
  buffer_.resize(old + size_t(n));
  if (n == 0) eof_ = true;
  return n > 0;
}

bool LineReader::next(std::string& line) {
  const uint64_t max_bytes = input_policy().file_bytes;
  size_t scanned = begin_;
  for (;;) {
    const size_t newline = buffer_.find('\n', scanned);
    if (newline != std::string::npos) {
      if (newline - begin_ > max_bytes) break;
      line.assign(buffer_, begin_, newline - begin_);
      begin_ = newline + 1;
      ++line_number_;
      unterminated_ = false;
      return true;
    }
    if (buffer_.size() - begin_ > max_bytes) break;
    scanned = buffer_.size() - begin_;
    if (!fill()) {
      if (buffer_.size() == begin_) return false;
      line.assign(buffer_, begin_, std::string::npos);
      begin_ = buffer_.size();
      ++line_number_;
      unterminated_ = true;
      return true;
    }
    scanned += begin_;  // fill() moved the unread bytes to the front (begin_ is 0 now)
  }
  throw InputError(fmt::format("line {} is longer than {}", line_number_ + 1, mib_text(max_bytes)),
                   "lines of JSON-lines files are limited like whole files: raise it with --max-input-mib N",
                   SourceLocation{path_, line_number_ + 1, 0});
}

}  // namespace choreo
