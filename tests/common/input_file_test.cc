// Reading input files within bounds (common/input_file): sizes checked before reading, directories
// named as such, paths named inside files confined to the naming file's directory, JSON lines streamed with a
// bound per line.

#include "common/input_file.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "common/error.h"
#include "dsl/pml/schema_parser.h"
#include "dsl/workflow_parser.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

TEST_CASE("an input file's size is checked before it is read, a directory is named as one") {
  ScratchDir s;
  const fs::path sparse = s.path / "huge.yaml";
  {
    std::ofstream(sparse) << "name: x\n";
  }
  fs::resize_file(sparse, uint64_t(1) << 30);  // 1 GiB, sparse: reading it would take a GiB of memory
  const std::string e = testing::input_error_text([&] { dsl::load_workflow(sparse.string()); });
  CHECK(e.find("limited to 4 MiB") != std::string::npos);
  CHECK(e.find("--max-input-mib") != std::string::npos);
  CHECK(testing::input_error_text([&] { read_input_file(s.str(), "schema file", 1 << 20); }).find("is a directory") !=
        std::string::npos);
  CHECK(testing::input_error_text([&] { dsl::load_workflow(s.str()); }).find("is a directory") != std::string::npos);
  CHECK(testing::input_error_text([&] { dsl::pml::load_schema(s.str()); }).find("is a directory") != std::string::npos);
  CHECK(testing::input_error_text([&] { read_input_file((s.path / "none").string(), "data file", 1); }).find("does not exist") !=
        std::string::npos);

  // Exactly at the limit is fine; one byte more is not.
  std::ofstream(s.path / "ten") << "0123456789";
  CHECK(read_input_file((s.path / "ten").string(), "file", 10) == "0123456789");
  CHECK_THROWS_AS(read_input_file((s.path / "ten").string(), "file", 9), InputError);

  // A FIFO is read when the user names it, refused when a file names it (it could block forever).
  const fs::path fifo = s.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(testing::input_error_text([&] { read_input_file(fifo.string(), "src file", 100, Origin::Referred); })
            .find("special file") != std::string::npos);
}

/// Writes `text` into the FIFO at `path` once a reader has opened it, and a moment later: a reader that takes
/// a writer not yet connected for the end of the file has returned by then. Gives up after 5 s without a
/// reader (a reader that returned at once may have come and gone between two looks).
std::thread write_after_reader_opens(const fs::path& path, std::string text) {
  return std::thread([path, text = std::move(text)] {
    int fd = -1;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) <
           0) {  // ENXIO until a reader opens
      if (std::chrono::steady_clock::now() > give_up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ::fcntl(fd, F_SETFL, 0);
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += size_t(n);
    }
    ::close(fd);
  });
}

// A FIFO opened before its writer reads as at its end; it was reported as an empty workflow (issue 42,
// finding 12). The reader waits for the writer, as cat does.
TEST_CASE("a named FIFO is read once its writer connects, whole and line by line") {
  ScratchDir s;
  const fs::path fifo = s.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string text =
      "name: w\nsteps: []\n" + std::string(100000, '#') + "\n";  // more than a pipe holds
  std::thread writer = write_after_reader_opens(fifo, text);
  const std::string read = read_input_file(fifo.string(), "workflow file", 1 << 20);
  writer.join();
  CHECK(read == text);

  writer = write_after_reader_opens(fifo, "{\"a\": 1}\n{\"b\": 2}\n");
  std::vector<std::string> lines;
  {
    LineReader reader(fifo.string(), "data file");
    for (std::string line; reader.next(line);) lines.push_back(line);
  }
  writer.join();
  CHECK(lines == std::vector<std::string>{"{\"a\": 1}", "{\"b\": 2}"});
}

TEST_CASE("--max-input-mib raises the limits") {
  ScratchDir s;
  const fs::path big = s.path / "big.yaml";
  {
    std::ofstream out(big);
    out << "name: big\nsteps: []\n#";
    out << std::string(5 << 20, 'x') << "\n";
  }
  CHECK(testing::input_error_text([&] { dsl::load_workflow(big.string()); }).find("limited to 4 MiB") != std::string::npos);
  testing::InputPolicyScope raised({}, 8);
  CHECK(testing::input_error_text([&] { dsl::load_workflow(big.string()); }).find("limited to") == std::string::npos);
}

TEST_CASE("PML src= stays inside the schema's directory unless --allow-path allows another") {
  ScratchDir s, outside;
  fs::create_directories(s.path / "sub");
  std::ofstream(s.path / "sub" / "inside.txt") << "inside text";
  std::ofstream(outside.path / "secret.txt") << "the secret line";
  fs::create_symlink(outside.path / "secret.txt", s.path / "link.txt");
  auto schema_with = [&](const std::string& src) {
    const fs::path file = s.path / "s.pml";
    std::ofstream(file) << "<schema name=\"s\"><module name=\"m\" src=\"" << src << "\"/></schema>\n";
    return file.string();
  };
  CHECK_NOTHROW(dsl::pml::load_schema(schema_with("sub/inside.txt")));
  CHECK_NOTHROW(dsl::pml::load_schema(schema_with((s.path / "sub" / "inside.txt").string())));  // absolute, inside
  CHECK_NOTHROW(dsl::pml::load_schema(schema_with("sub/../sub/inside.txt")));
  for (const std::string& bad : {(outside.path / "secret.txt").string(), std::string("../") +
                                                                             outside.path.filename().string() +
                                                                             "/secret.txt",
                                 std::string("link.txt"), std::string("/etc/passwd")}) {
    CAPTURE(bad);
    const std::string e = testing::input_error_text([&] { dsl::pml::load_schema(schema_with(bad)); });
    CHECK(e.find("leads outside the directory of s.pml") != std::string::npos);
    CHECK(e.find("s.pml:1:") != std::string::npos);  // located at the attribute
    CHECK(e.find("--allow-path") != std::string::npos);
    CHECK(e.find("the secret line") == std::string::npos);
  }
  testing::InputPolicyScope allowed({outside.str()});
  CHECK_NOTHROW(dsl::pml::load_schema(schema_with((outside.path / "secret.txt").string())));
  CHECK_NOTHROW(dsl::pml::load_schema(schema_with("link.txt")));
  CHECK_THROWS_AS(dsl::pml::load_schema(schema_with("/etc/passwd")), InputError);
}

TEST_CASE("an --allow-path that is not a directory is a usage error") {
  ScratchDir s;
  CHECK_THROWS_AS(configure_input_policy(0, {(s.path / "missing").string()}), InputError);
  configure_input_policy(0, {});
}

TEST_CASE("LineReader: lines one at a time, an unterminated last line, and a bound per line") {
  ScratchDir s;
  const fs::path file = s.path / "rows.jsonl";
  std::string long_line(100000, 'a');
  std::ofstream(file, std::ios::binary) << "one\n\r\n" << long_line << "\nlast";
  LineReader reader(file.string(), "rows file");
  std::string line;
  REQUIRE(reader.next(line));
  CHECK(line == "one");
  CHECK(reader.line_number() == 1);
  REQUIRE(reader.next(line));
  CHECK(line == "\r");
  REQUIRE(reader.next(line));
  CHECK(line == long_line);
  CHECK_FALSE(reader.last_line_unterminated());
  REQUIRE(reader.next(line));
  CHECK(line == "last");
  CHECK(reader.line_number() == 4);
  CHECK(reader.last_line_unterminated());
  CHECK_FALSE(reader.next(line));

  // A line longer than the limit is an error at its line, found without holding more than the limit.
  const fs::path huge = s.path / "huge.jsonl";
  {
    std::ofstream out(huge, std::ios::binary);
    out << "{}\n";
    out << std::string((1 << 20) + 10, 'x') << "\n";
  }
  testing::InputPolicyScope small({}, 1);
  LineReader bounded(huge.string(), "rows file");
  REQUIRE(bounded.next(line));
  try {
    bounded.next(line);
    FAIL("a line past the limit was read");
  } catch (const InputError& e) {
    CHECK(e.where().line == 2);
    CHECK(e.message().find("longer than 1 MiB") != std::string::npos);
  }
}

}  // namespace
}  // namespace choreo
