#include "runtime/store/store_marker.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/store/disk_store.h"

namespace choreo::store {

namespace fs = std::filesystem;

MarkerState marker_state(const std::string& dir) {
  const std::string path = dir + "/" + std::string(kMarkerName);
  // O_NOFOLLOW | O_NONBLOCK: a symlink or a FIFO at the marker's name is no marker, and must not block.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return errno == ENOENT ? MarkerState::Absent : MarkerState::Invalid;
  struct stat st;
  char text[64] = {};
  ssize_t got = -1;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) got = ::read(fd, text, sizeof(text));
  ::close(fd);
  const std::string expected = std::string(kMarkerLine) + "\n";
  if (got < ssize_t(expected.size())) return MarkerState::Invalid;
  return std::string_view(text, expected.size()) == expected ? MarkerState::Valid : MarkerState::Invalid;
}

bool is_store_name(std::string_view name) {
  if (name == "lock" || name == kMarkerName) return true;
  if (name.size() > 1 && name.front() == '.' && name.ends_with(".tmp")) return true;
  return name.size() == 20 && name.ends_with(".ckv") && parse_key_hex(name.substr(0, 16)).has_value();
}

std::optional<std::string> first_foreign_name(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& de : fs::directory_iterator(dir, ec)) {
    std::string name = de.path().filename().string();
    if (!is_store_name(name)) return name;
  }
  if (ec) throw RuntimeFailure(fmt::format("cannot read the cache directory {}: {}", dir, ec.message()));
  return std::nullopt;
}

void write_marker(const std::string& dir) {
  const std::string path = dir + "/" + std::string(kMarkerName);
  const std::string content = fmt::format(
      "{}\nThis directory is a choreo persistent encoding store (entries: CHOREOKV format {}; "
      "docs/store.md).\n"
      "`choreo cache gc` and `choreo cache rm` act only on directories that hold this file.\n",
      kMarkerLine, kFormatVersion);
  // Every writer writes the same bytes, so concurrent adopters may each rename theirs: the last one wins.
  TemporaryFile temp(path);
  write_all_or_throw(temp.fd(), content, temp.path());
  temp.commit();
}

}  // namespace choreo::store
