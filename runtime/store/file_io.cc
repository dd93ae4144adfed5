#include "runtime/store/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/common/error.h"

namespace choreo::store {

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw RuntimeFailure(fmt::format("cannot write {}: {}", path, errno_text()));
    }
    p += w;
    n -= size_t(w);
  }
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw RuntimeFailure(fmt::format("cannot open {}: {}", dir, errno_text()));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeFailure(fmt::format("cannot fsync {}: {}", dir, errno_text()));
}

void fsync_file(int fd, const std::string& path) {
  if (::fsync(fd) != 0) throw RuntimeFailure(fmt::format("cannot fsync {}: {}", path, errno_text()));
}

bool rename_into_place(const std::string& temp, const std::string& target, const std::string& dir) {
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    if (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) return false;
    throw RuntimeFailure(fmt::format("cannot rename {} to {}: {}", temp, target, errno_text()));
  }
  fsync_dir(dir);
  return true;
}

}  // namespace choreo::store
