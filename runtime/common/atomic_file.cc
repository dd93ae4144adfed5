#include "runtime/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/common/error.h"

namespace choreo {

namespace {

void write_all(int fd, std::string_view content, const std::string& path, const std::string& temporary) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      if (!temporary.empty()) ::unlink(temporary.c_str());
      throw RuntimeFailure(fmt::format("writing '{}' failed: {}", path, std::strerror(e)));
    }
    written += size_t(n);
  }
}

/// A file that is written in place rather than replaced: a character device (/dev/null) or a FIFO (a pipe).
bool written_in_place(const std::filesystem::file_status& status) {
  return std::filesystem::is_character_file(status) || std::filesystem::is_fifo(status);
}

}  // namespace

std::string rename_target(const std::string& path, std::string_view flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path target(path);
  // Follow symlinks one step at a time (relative targets are relative to the link's directory).
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    if (hops == 40) throw InputError(fmt::format("{} {}: too many levels of symbolic links", flag, path));
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) break;
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const fs::file_status status = fs::status(target, ec);
  if (!ec && fs::exists(status) && !fs::is_regular_file(status))
    throw InputError(fmt::format("{} {}: not a regular file, and writing replaces the file it names", flag, path),
                     "give the path of a file (it is created or replaced)");
  return target.string();
}

void write_file_atomically(const std::string& path, std::string_view content) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!ec && written_in_place(status)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw RuntimeFailure(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    write_all(fd, content, path, {});
    if (::close(fd) != 0) throw RuntimeFailure(fmt::format("writing '{}' failed: {}", path, std::strerror(errno)));
    return;
  }
  const std::string target = rename_target(path, "output");
  const std::string temporary = fmt::format("{}.tmp.{}", target, getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeFailure(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  write_all(fd, content, path, temporary);
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(temporary.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(temporary.c_str());
    throw RuntimeFailure(fmt::format("writing '{}' failed: {}", path, std::strerror(e)));
  }
}

void check_writable(const std::string& path, std::string_view flag) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
      !written_in_place(status))
    throw InputError(fmt::format("{} {}: not a regular file", flag, path), "give the path of a file to write");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(fmt::format("{} {}: directory '{}' does not exist", flag, path, dir.string()),
                     "create the directory first or choose another path");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(fmt::format("{} {}: directory '{}' is not writable", flag, path, dir.string()),
                     "choose a path in a writable directory");
}

}  // namespace choreo
