#include "common/atomic_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace choreo {

namespace fs = std::filesystem;

namespace {

/// What the rules make of an output path.
struct OutputTarget {
  std::string path;        // the file to replace, append to or write
  bool in_place = false;   // a FIFO or character device: written, never replaced
  bool exists = false;
  mode_t mode = 0;
};

std::string owner_text(uid_t uid) { return fmt::format("uid {}", uid); }

/// True for a file that lives in a kernel pseudo file system (/proc, /sys), where "writing a file" pokes
/// the kernel: /proc/self/mem, /sys/... .
bool in_pseudo_file_system(const std::string& path) {
  struct statfs fs_info;
  if (::statfs(path.c_str(), &fs_info) != 0) return false;
  return fs_info.f_type == PROC_SUPER_MAGIC || fs_info.f_type == SYSFS_MAGIC;
}

OutputTarget resolve_output(const std::string& path, std::string_view flag) {
  if (path.empty()) throw InputError(fmt::format("{}: the path is empty", flag), "give the path of a file");
  // Follow symlinks one hop at a time, checking who owns each link. A /proc "magic" link (/dev/stdout ->
  // /proc/self/fd/1 -> pipe:[123]) names no path; the kernel resolves it, so the walk stops there.
  fs::path target(path);
  const uid_t me = ::geteuid();
  for (int hops = 0;; ++hops) {
    struct stat link;
    if (::lstat(target.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) break;
    if (hops == 40) throw InputError(fmt::format("{} {}: too many levels of symbolic links", flag, path));
    if (link.st_uid != me && link.st_uid != 0)
      throw InputError(fmt::format("{} {}: '{}' is a symbolic link owned by another user ({})", flag, path,
                                   target.string(), owner_text(link.st_uid)),
                       "choreo follows only symbolic links owned by you or by root (docs/limits.md); give the "
                       "path of the file itself");
    std::error_code ec;
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) break;
    const fs::path candidate = next.is_absolute() ? next : target.parent_path() / next;
    struct stat probe;
    if (::lstat(candidate.c_str(), &probe) != 0 && ::lstat(candidate.parent_path().c_str(), &probe) != 0) break;
    target = candidate;
  }
  OutputTarget out;
  struct stat st;
  // stat() of the path as given lets the kernel resolve what the walk could not (magic links).
  if (::stat(path.c_str(), &st) == 0) {
    out.exists = true;
    out.mode = st.st_mode;
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      out.in_place = true;
      out.path = path;
      return out;
    }
    if (!S_ISREG(st.st_mode))
      throw InputError(fmt::format("{} {}: not a regular file, and writing replaces the file it names", flag, path),
                       "give the path of a file (it is created or replaced)");
    if (in_pseudo_file_system(path))
      throw InputError(fmt::format("{} {}: a file of /proc or /sys, which choreo never writes", flag, path),
                       "give the path of an ordinary file");
  }
  out.path = target.string();
  return out;
}

[[noreturn]] void io_failure(const std::string& what, const std::string& path, int error) {
  throw RuntimeFailure(fmt::format("{} '{}' failed: {}", what, path, std::strerror(error)));
}

/// 16 hex digits from the kernel's random source.
std::string random_suffix() {
  uint64_t bits = 0;
  size_t got = 0;
  while (got < sizeof bits) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(&bits) + got, sizeof bits - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io_failure("getrandom", "for a temporary file name", errno);
    got += size_t(n);
  }
  return fmt::format("{:016x}", bits);
}

void fsync_directory_of(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
  }
}

}  // namespace

bool write_all(int fd, std::string_view content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    written += size_t(n);
  }
  return true;
}

std::string rename_target(const std::string& path, std::string_view flag) {
  const OutputTarget t = resolve_output(path, flag);
  if (t.in_place)
    throw InputError(fmt::format("{} {}: not a regular file, and writing replaces the file it names", flag, path),
                     "give the path of a file (it is created or replaced)");
  return t.path;
}

TemporaryFile::TemporaryFile(const std::string& target, bool read_write) : target_(target) {
  const fs::path final_path(target);
  struct stat st;
  const mode_t mode = ::stat(target.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0666;
  for (int attempt = 0; fd_ < 0; ++attempt) {
    path_ = (final_path.parent_path() / ("." + final_path.filename().string() + "." + random_suffix() + ".tmp"))
                .string();
    fd_ = ::open(path_.c_str(), (read_write ? O_RDWR : O_WRONLY) | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd_ < 0 && (errno != EEXIST || attempt == 8)) io_failure("creating a temporary file for", target, errno);
  }
}

TemporaryFile::~TemporaryFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

bool TemporaryFile::publish() {
  if (::fsync(fd_) != 0) io_failure("writing", target_, errno);
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) io_failure("writing", target_, errno);
  if (::rename(path_.c_str(), target_.c_str()) != 0) {
    if (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) return false;
    io_failure("renaming into place", target_, errno);
  }
  committed_ = true;
  fsync_directory_of(target_);
  return true;
}

void TemporaryFile::commit() {
  if (!publish())
    throw RuntimeFailure(fmt::format("writing '{}' failed: a directory stands at that path", target_));
}

void write_all_or_throw(int fd, std::string_view bytes, const std::string& path) {
  if (!write_all(fd, bytes)) io_failure("writing", path, errno);
}

void write_file_atomically(const std::string& path, std::string_view content) {
  const OutputTarget t = resolve_output(path, "output");
  if (t.in_place) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) io_failure("opening", path, errno);
    const bool ok = write_all(fd, content);
    const int e = errno;
    if (::close(fd) != 0 || !ok) io_failure("writing", path, ok ? errno : e);
    return;
  }
  TemporaryFile temporary(t.path);
  if (!write_all(temporary.fd(), content)) io_failure("writing", path, errno);
  temporary.commit();
}

int open_for_append(const std::string& path, std::string_view flag) {
  const OutputTarget t = resolve_output(path, flag);
  // Read-write: a resumed results file is repaired by reading back from its end.
  const int flags = t.in_place ? O_WRONLY | O_CLOEXEC : O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC;
  const int fd = ::open(t.in_place ? path.c_str() : t.path.c_str(), flags, 0666);
  if (fd < 0) io_failure("opening", path, errno);
  struct stat st;
  // The file could have been swapped between the checks and the open: check what was opened.
  if (::fstat(fd, &st) != 0 || (!t.in_place && !S_ISREG(st.st_mode))) {
    ::close(fd);
    throw InputError(fmt::format("{} {}: not a regular file", flag, path), "give the path of a file");
  }
  return fd;
}

bool check_writable(const std::string& path, std::string_view flag) {
  const OutputTarget t = resolve_output(path, flag);
  if (t.in_place) return true;
  fs::path dir = fs::path(t.path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(fmt::format("{} {}: directory '{}' does not exist", flag, path, dir.string()),
                     "create the directory first or choose another path");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(fmt::format("{} {}: directory '{}' is not writable", flag, path, dir.string()),
                     "choose a path in a writable directory");
  return false;
}

}  // namespace choreo
