#include "runtime/store/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace choreo::store {

namespace {

/// Benchmark hook (scripts/bench_tiers.py, docs/store.md "Test hooks"): with $CHOREO_STORE_COLD_READS=1
/// every file is dropped from the page cache when it is opened, so what is read from it comes from the disk.
bool cold_reads() {
  static const bool on = [] {
    const char* env = std::getenv("CHOREO_STORE_COLD_READS");
    return env && std::string_view(env) == "1";
  }();
  return on;
}

}  // namespace

std::optional<MappedFile> MappedFile::open(const std::string& path, MapFailure* failure) {
  auto fail = [failure](MapFailure why) {
    if (failure) *failure = why;
    return std::nullopt;
  };
  if (failure) *failure = MapFailure::None;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0)
    return fail(errno == ENOENT ? MapFailure::Missing : MapFailure::Unreadable);
  if (!S_ISREG(st.st_mode))
    return fail(MapFailure::NotRegularFile);  // not even opened (a device could react)
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return fail(MapFailure::Missing);
    return fail(errno == ELOOP ? MapFailure::NotRegularFile : MapFailure::Unreadable);
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // swapped between lstat and open
    ::close(fd);
    return fail(MapFailure::NotRegularFile);
  }
  if (st.st_size == 0) {
    ::close(fd);
    return MappedFile(nullptr, 0);
  }
  if (cold_reads()) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* data = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file (even once unlinked or replaced by rename)
  if (data == MAP_FAILED) return fail(MapFailure::Unreadable);
  return MappedFile(static_cast<const uint8_t*>(data), size_t(st.st_size));
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_bytes_(std::exchange(other.size_bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_bytes_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

}  // namespace choreo::store
