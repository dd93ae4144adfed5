// Output files (runtime/common/atomic_file, and the GGUF writer that shares its rule): a write replaces a
// regular file through a rename, follows a symlink to replace its target, writes a FIFO or character device
// in place, and refuses anything else. Before this, `-o /dev/null` as root renamed a file over the device.
// Everything here happens in a scratch directory; nothing touches /dev.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/common/atomic_file.h"
#include "runtime/common/error.h"
#include "runtime/model/gguf.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

using Scratch = testing::ScratchDir;

using testing::read_file;

TEST_CASE("atomic writes: a regular file is replaced; a symlink keeps pointing at its replaced target") {
  Scratch s;
  const fs::path real = s.path / "real.json", link = s.path / "link.json", chain = s.path / "chain.json";
  std::ofstream(real) << "old";
  fs::create_symlink("real.json", link);  // relative, resolved against the link's directory
  fs::create_symlink(link, chain);
  write_file_atomically(chain.string(), "new");
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(fs::is_symlink(fs::symlink_status(chain)));
  CHECK(read_file(real) == "new");
  write_file_atomically(real.string(), "newer");
  CHECK(read_file(real) == "newer");
  // A dangling link creates its target.
  fs::create_symlink("made.json", s.path / "dangling.json");
  write_file_atomically((s.path / "dangling.json").string(), "made");
  CHECK(read_file(s.path / "made.json") == "made");
  CHECK(fs::is_symlink(fs::symlink_status(s.path / "dangling.json")));
}

TEST_CASE("atomic writes: a FIFO is written in place and stays a FIFO; a directory is refused") {
  Scratch s;
  const fs::path fifo = s.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // The read end is opened first, without blocking, so the write cannot block and a regression (a rename over
  // the FIFO) shows as nothing received rather than a hang. The text fits the pipe's buffer.
  const int read_end = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(read_end >= 0);
  write_file_atomically(fifo.string(), "through the pipe");
  char buffer[64] = {};
  const ssize_t n = ::read(read_end, buffer, sizeof buffer);
  ::close(read_end);
  CHECK(std::string(buffer, n > 0 ? size_t(n) : 0) == "through the pipe");
  CHECK(fs::is_fifo(fs::status(fifo)));

  const fs::path dir = s.path / "dir";
  fs::create_directories(dir);
  CHECK_THROWS_AS(write_file_atomically(dir.string(), "x"), InputError);
  CHECK_THROWS_AS(check_writable(dir.string(), "--json"), InputError);
  CHECK(fs::is_directory(dir));
  CHECK(fs::is_empty(dir));
}

TEST_CASE("the GGUF writer refuses a FIFO and a directory, and writes through a symlink") {
  Scratch s;
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  const fs::path fifo = s.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_AS(w.write(fifo.string()), InputError);
  CHECK(fs::is_fifo(fs::status(fifo)));
  CHECK_THROWS_AS(w.write(s.path.string()), InputError);
  const fs::path real = s.path / "m.gguf", link = s.path / "link.gguf";
  std::ofstream(real) << "old";
  fs::create_symlink("m.gguf", link);
  w.write(link.string());
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(gguf::File::open(real.string()).get_string("general.architecture", "") == "llama");
}

}  // namespace
}  // namespace choreo
