// Output files (common/atomic_file, and the GGUF writer that shares its rule): a write replaces a
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
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "kernels/dtype.h"
#include "runtime/eval/merge.h"
#include "runtime/eval/results.h"
#include "runtime/model/gguf.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

using Scratch = testing::ScratchDir;

using testing::read_file;

TEST_CASE("atomic writes: a regular file is replaced, a symlink keeps pointing at its replaced target") {
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

TEST_CASE("atomic writes: a FIFO is written in place and stays a FIFO, a directory is refused") {
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

TEST_CASE("the GGUF writer writes a FIFO in place, refuses a directory, and writes through a symlink") {
  Scratch s;
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  // Two tensors, so that the stream carries the alignment padding before each.
  w.add_tensor("a", {3}, kernels::DType::F32, std::vector<uint8_t>(12, 0xab));
  w.add_tensor("b", {5}, kernels::DType::F32, std::vector<uint8_t>(20, 0xcd));
  const std::vector<uint8_t> bytes = w.to_bytes();
  const fs::path fifo = s.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // As above: the read end first, without blocking; the file fits the pipe's buffer.
  const int read_end = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(read_end >= 0);
  w.write(fifo.string());
  std::vector<uint8_t> received(bytes.size() + 64);
  const ssize_t n = ::read(read_end, received.data(), received.size());
  ::close(read_end);
  received.resize(n > 0 ? size_t(n) : 0);
  CHECK(received == bytes);  // what a file would hold
  CHECK(fs::is_fifo(fs::status(fifo)));
  CHECK_THROWS_AS(w.write(s.path.string()), InputError);
  const fs::path real = s.path / "m.gguf", link = s.path / "link.gguf";
  std::ofstream(real) << "old";
  fs::create_symlink("m.gguf", link);
  w.write(link.string());
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(gguf::File::open(real.string()).get_string("general.architecture", "") == "llama");
}

/// A file outside the scratch directory whose bytes must never change.
struct Decoy {
  testing::ScratchDir dir;
  fs::path path = dir.path / "decoy.txt";
  Decoy() { std::ofstream(path) << "precious"; }
  bool intact() const { return read_file(path) == "precious"; }
};

TEST_CASE("hostile: a symlink planted at a temporary file's old, predictable name redirects nothing") {
  Scratch s;
  Decoy decoy;
  const fs::path out = s.path / "out.json", model = s.path / "m.gguf";
  // The names earlier versions used: <out>.tmp.<pid> for outputs, .tmp.<name>.<pid> for GGUF files.
  fs::create_symlink(decoy.path, s.path / fmt::format("out.json.tmp.{}", ::getpid()));
  fs::create_symlink(decoy.path, s.path / fmt::format(".tmp.m.gguf.{}", ::getpid()));
  write_file_atomically(out.string(), "result");
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.write(model.string());
  CHECK(decoy.intact());
  CHECK(read_file(out) == "result");
  CHECK(gguf::File::open(model.string()).get_string("general.architecture", "") == "llama");
  // Only the planted links and the two outputs are there: no temporary file was left behind.
  CHECK(std::distance(fs::directory_iterator(s.path), fs::directory_iterator()) == 4);
}

TEST_CASE("hostile: files of /proc are refused by every writer, appends included") {
  for (const char* path : {"/proc/self/mem", "/proc/self/environ"}) {
    CAPTURE(path);
    CHECK_THROWS_AS(check_writable(path, "--out"), InputError);
    CHECK_THROWS_AS(write_file_atomically(path, "x"), InputError);
    CHECK_THROWS_AS(eval::ResultWriter{path}, InputError);
    CHECK_THROWS_AS(eval::write_results(path, {}), InputError);
  }
}

TEST_CASE("hostile: merge -o never deletes what is at its path") {
  Scratch s;
  const fs::path dir = s.path / "empty_dir";
  fs::create_directories(dir);
  CHECK_THROWS_AS(eval::write_results(dir.string(), {}), InputError);
  CHECK(fs::is_directory(dir));
  const fs::path fifo = s.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int read_end = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(read_end >= 0);
  eval::ResultRow row;
  row.id = "1";
  row.mode = "choreo";
  eval::write_results(fifo.string(), {row});  // written in place, the FIFO stays
  char buffer[512] = {};
  CHECK(::read(read_end, buffer, sizeof buffer) > 0);
  ::close(read_end);
  CHECK(std::string(buffer).find("\"id\":\"1\"") != std::string::npos);
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
}

TEST_CASE("a replaced file keeps its permission bits, appends follow the user's own symlink") {
  Scratch s;
  const fs::path file = s.path / "private.json";
  std::ofstream(file) << "old";
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  write_file_atomically(file.string(), "new");
  CHECK((fs::status(file).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));

  const fs::path results = s.path / "results.jsonl", link = s.path / "link.jsonl";
  std::ofstream(results) << "{\"id\": \"0\"}\n{\"id\": \"par";  // a killed run's last line, cut short
  fs::create_symlink("results.jsonl", link);
  {
    eval::ResultWriter writer(link.string());
    eval::ResultRow row;
    row.id = "1";
    writer.append(row);
  }
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  const std::string text = read_file(results);
  CHECK(text.starts_with("{\"id\": \"0\"}\n{\"id\":\"1\""));  // the cut-off line was dropped first
}

TEST_CASE("hostile: a symlink owned by another user is never followed") {
  // Only root can make a link owned by someone else. Anyone else is told that the case checked nothing, rather
  // than seeing it pass.
  if (::geteuid() != 0) {
    MESSAGE("SKIPPED: not root (euid ", ::geteuid(), "), so no symlink owned by another user can be made");
    return;
  }
  Scratch s;
  Decoy decoy;
  const fs::path link = s.path / "out.json";
  fs::create_symlink(decoy.path, link);
  REQUIRE(::lchown(link.c_str(), 65534, 65534) == 0);
  CHECK_THROWS_AS(check_writable(link.string(), "--json"), InputError);
  CHECK_THROWS_AS(write_file_atomically(link.string(), "x"), InputError);
  CHECK_THROWS_AS(eval::ResultWriter{link.string()}, InputError);
  CHECK_THROWS_AS(eval::write_results(link.string(), {}), InputError);
  CHECK(decoy.intact());
  CHECK(fs::is_symlink(fs::symlink_status(link)));
}

}  // namespace
}  // namespace choreo
