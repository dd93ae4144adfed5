#include "runtime/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/common/error.h"

namespace choreo {

void write_file_atomically(const std::string& path, std::string_view content) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeFailure(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw RuntimeFailure(fmt::format("writing '{}' failed: {}", path, std::strerror(e)));
    }
    written += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temporary.c_str());
    throw RuntimeFailure(fmt::format("writing '{}' failed: {}", path, std::strerror(e)));
  }
}

void check_writable(const std::string& path, std::string_view flag) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw InputError(fmt::format("{} {}: directory '{}' does not exist", flag, path, dir.string()),
                     "create the directory first or choose another path");
  if (::access(dir.c_str(), W_OK) != 0)
    throw InputError(fmt::format("{} {}: directory '{}' is not writable", flag, path, dir.string()),
                     "choose a path in a writable directory");
}

}  // namespace choreo
