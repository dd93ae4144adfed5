// Hostile inputs against the real binary, for what choreo reads and writes (docs/limits.md): each run must end
// in a clean error or a success (never a signal or a hang: every run has a time limit), and files outside the
// scratch directory (decoys) must not change.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using testing::ProcessOptions;
using testing::ProcessResult;
using testing::read_file;
using testing::ScratchDir;

ProcessResult choreo_run(const std::vector<std::string>& args, const fs::path& scratch, double timeout_s = 60) {
  ProcessOptions options;
  options.timeout_seconds = timeout_s;
  return testing::run_process(testing::choreo_binary(), args, scratch, options);
}

/// A file outside the test's scratch directory holding a secret; it must neither change nor leak.
struct Secret {
  ScratchDir dir;
  fs::path path = dir.path / "shadow";
  static constexpr const char* kText = "root:$6$very-secret-hash:19000:0:99999:7:::";
  Secret() { std::ofstream(path) << kText << "\n"; }
  bool intact() const { return read_file(path) == std::string(kText) + "\n"; }
};

TEST_SUITE("hostile") {
  TEST_CASE("a 1 GB sparse workflow file is refused before it is read") {
    ScratchDir s;
    const fs::path huge = s.path / "huge.yaml";
    std::ofstream(huge) << "name: huge\n";
    fs::resize_file(huge, uint64_t(1) << 30);
    const ProcessResult r = choreo_run({"check", huge.string()}, s.path);
    CHECK(r.exited);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("limited to 4 MiB") != std::string::npos);
    CHECK(r.max_rss_kib < 200 * 1024);  // it read nothing (it once took 3 GB)
  }

  TEST_CASE("a data row cannot make a workflow read a file outside its directory, nor learn its contents") {
    ScratchDir s;
    Secret secret;
    const std::string model = testing::shared_file("models/stories260K.gguf");
    const fs::path workflow = s.path / "wf.yaml";
    std::ofstream(workflow) << "name: wf\n"
                               "inputs: {schema: {type: string}}\n"
                               "messages:\n"
                               "  doc:\n"
                               "    pml: \"{{ schema }}\"\n"
                               "    prompt: '<prompt schema=\"s\"><m/></prompt>'\n"
                               "steps:\n"
                               "  - decode: {as: a, parents: [doc], header: \"Once\", max_tokens: 2}\n";
    const fs::path rows = s.path / "rows.jsonl";
    std::ofstream(rows) << "{\"schema\": \"" << secret.path.string() << "\"}\n"
                        << "{\"schema\": \"../" << secret.dir.path.filename().string() << "/shadow\"}\n";
    const ProcessResult r = choreo_run({"run", workflow.string(), "-m", model, "--inputs", rows.string()}, s.path);
    CHECK(testing::ended_cleanly(r));
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("leads outside the directory of wf.yaml") != std::string::npos);
    CHECK(r.err.find("very-secret") == std::string::npos);
    CHECK(r.out.find("very-secret") == std::string::npos);

    // Inside an allowed directory the file is read, and its parse error does not quote it either: the path
    // came from the data, not from the user.
    const ProcessResult allowed = choreo_run(
        {"run", workflow.string(), "-m", model, "--inputs", rows.string(), "--allow-path", secret.dir.str()},
        s.path);
    CHECK(testing::ended_cleanly(allowed));
    CHECK(allowed.exit_code == 2);
    CHECK(allowed.err.find("very-secret") == std::string::npos);
    CHECK(secret.intact());
  }

  TEST_CASE("a PML src= cannot pull a file from outside the schema's directory into a prompt") {
    ScratchDir s;
    Secret secret;
    const std::string model = testing::shared_file("models/stories260K.gguf");
    const fs::path schema = s.path / "s.pml";
    std::ofstream(schema) << "<schema name=\"s\"><module name=\"m\" src=\"" << secret.path.string()
                          << "\"/></schema>\n";
    const ProcessResult r = choreo_run({"encode", schema.string(), "-m", model, "--no-store"}, s.path);
    CHECK(testing::ended_cleanly(r));
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("s.pml:1:") != std::string::npos);
    CHECK(r.err.find("very-secret") == std::string::npos);
  }

  TEST_CASE("output paths: nothing is deleted, /proc is refused, and a failed run still writes --json") {
    ScratchDir s;
    const std::string model = testing::shared_file("models/stories260K.gguf");
    const fs::path results = s.path / "r.jsonl";
    std::ofstream(results)
        << "{\"id\": \"1\", \"mode\": \"choreo\", \"prediction\": \"4\", \"gold\": [\"4\"], "
           "\"score\": 1}\n";
    const fs::path empty_dir = s.path / "empty";
    fs::create_directories(empty_dir);
    for (const std::string& target : {empty_dir.string(), std::string("/proc/self/mem")}) {
      CAPTURE(target);
      const ProcessResult r = choreo_run({"eval", "merge", results.string(), "-o", target}, s.path);
      CHECK(r.exited);
      CHECK(r.exit_code == 2);
    }
    CHECK(fs::is_directory(empty_dir));

    // A workflow that fails after its first decode (on its generated text, which only the run knows, so the
    // plan compiled before the first call cannot fail on it): --json keeps that decode, marked incomplete.
    const fs::path workflow = s.path / "fails.yaml";
    std::ofstream(workflow) << "name: fails\n"
                               "messages:\n  a: {text: \"Once upon a time\"}\n"
                               "steps:\n"
                               "  - decode: {as: b, parents: [a], header: \"There\", max_tokens: 2}\n"
                               "  - let: {n: \"int(b)\"}\n";
    const fs::path json = s.path / "run.json", trace = s.path / "trace.json";
    const ProcessResult r = choreo_run(
        {"run", workflow.string(), "-m", model, "--json", json.string(), "--trace", trace.string()}, s.path);
    CHECK(testing::ended_cleanly(r));
    CHECK(r.exit_code == 2);
    const std::string written = read_file(json);
    CHECK(written.find("\"incomplete\": true") != std::string::npos);
    CHECK(written.find("\"name\": \"b\"") != std::string::npos);
    CHECK(read_file(trace).find("(incomplete)") != std::string::npos);
  }

  // A line without a newline at the end of an output file is cut off only when it is a killed writer's line:
  // it starts as the writer's lines start, after lines that are that writer's (issue 42, finding 5).
  TEST_CASE("eval --out and finetune traces -o keep a file that is not theirs, and drop only a cut-off row") {
    ScratchDir s;
    const std::string model = testing::shared_file("models/stories260K.gguf");
    const fs::path workflow = s.path / "w.yaml";
    std::ofstream(workflow)
        << "name: w\ninputs: {question: string}\nmessages:\n  m: {text: \"Once\"}\nsteps:\n"
           "  - decode: {as: a, parents: [m], header: \" a\", max_tokens: 1}\n"
           "output: \"{{ a }}\"\n";
    const fs::path data = s.path / "d.jsonl";
    std::ofstream(data) << "{\"id\": \"r1\", \"question\": \"x\", \"answer\": \"1\"}\n";
    const auto eval_into = [&](const fs::path& out, bool resume) {
      std::vector<std::string> args = {"eval",  workflow.string(), "--data", data.string(), "--format",
                                       "jsonl", "--metric",        "qa_f1",  "-m",          model,
                                       "--out", out.string()};
      if (resume) args.push_back("--resume");
      return choreo_run(args, s.path);
    };
    const auto write = [&](const std::string& name, const std::string& text) {
      const fs::path path = s.path / name;
      std::ofstream(path, std::ios::binary) << text;
      return path;
    };
    // Not a results file: a token, a note, JSON that is no row, a row's start after lines that are no rows.
    for (const std::string& text :
         {std::string("sk-0123456789abcdef"), std::string("remember: buy milk"),
          std::string("{\"note\": \"keep\""), std::string("notes\n{\"id\":\"r1\",\"mo")}) {
      CAPTURE(text);
      for (bool resume : {false, true}) {
        const fs::path out = write("kept.txt", text);
        const ProcessResult r = eval_into(out, resume);
        CHECK(testing::ended_cleanly(r));
        CHECK(r.exit_code == 2);
        CHECK(read_file(out) == text);
      }
      const fs::path traces = write("traces.txt", text);
      const fs::path rows = write("rows.jsonl", "{\"question\": \"x\"}\n");
      const ProcessResult r = choreo_run({"finetune", "traces", workflow.string(), "--inputs", rows.string(),
                                          "-m", model, "-o", traces.string()},
                                         s.path);
      CHECK(testing::ended_cleanly(r));
      CHECK(r.exit_code == 2);
      CHECK(read_file(traces) == text);
    }
    // A killed writer's first line: dropped, and the run writes its row.
    const fs::path cut = write("cut.jsonl", "{\"id\":\"r1\",\"mode\":\"cho");
    const ProcessResult r = eval_into(cut, false);
    CHECK(r.exit_code == 0);
    const std::string written = read_file(cut);
    CHECK(written.rfind("{\"id\":\"r1\",\"mode\":\"choreo\"", 0) == 0);
    CHECK(std::count(written.begin(), written.end(), '\n') == 1);
    CHECK(written.back() == '\n');
  }

  TEST_CASE("bad input files give clean errors: a directory, an empty prompt file, a huge JSON line") {
    ScratchDir s;
    const std::string model = testing::shared_file("models/stories260K.gguf");
    const fs::path schema = s.path / "s.pml";
    std::ofstream(schema) << "<schema name=\"s\"><module name=\"m\">Once upon a time</module></schema>\n";
    std::ofstream(s.path / "empty.txt") << "  \n";
    const fs::path workflow = s.path / "w.yaml";
    std::ofstream(workflow) << "name: w\ninputs: {x: {type: string}}\nmessages:\n  a: {text: \"{{ x }}\"}\n"
                               "steps:\n  - decode: {as: b, parents: [a], header: \"There\", max_tokens: 2}\n";
    const fs::path rows = s.path / "rows.jsonl";
    {
      std::ofstream out(rows);
      out << "{\"x\": \"" << std::string((2 << 20), 'y') << "\"}\n";
    }
    const fs::path fifo = s.path / "model.gguf", fifo_yaml = s.path / "pipe.yaml";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    REQUIRE(::mkfifo(fifo_yaml.c_str(), 0600) == 0);
    struct Case {
      std::vector<std::string> args;
      std::string expected;
    };
    const std::vector<Case> cases = {
        {{"check", s.str()}, "is a directory"},
        {{"encode", s.str(), "-m", model, "--no-store"}, "is a directory"},
        {{"encode", schema.string(), "-m", model, "--no-store", "--prompt-file", (s.path / "empty.txt").string()},
         "prompt file"},
        {{"encode", schema.string(), "-m", model, "--no-store", "--prompt-file", s.str()}, "is a directory"},
        {{"run", workflow.string(), "-m", model, "--inputs", rows.string(), "--max-input-mib", "1"},
         "line 1 is longer than 1 MiB"},
        {{"eval", workflow.string(), "--data", s.str()}, "is a directory"},
        {{"exec", "-m", model, s.str()}, "is a directory"},
        {{"run", workflow.string(), "--allow-path", (s.path / "missing").string()}, "not an existing directory"},
        {{"generate", "-m", s.str(), "-p", "hi"}, "a directory, not a GGUF file"},
        {{"generate", "-m", fifo.string(), "-p", "hi"}, "not a regular file"},  // once blocked in open()
        {{"check", fifo_yaml.string()}, "workflow file"},  // a named FIFO is read as a stream: no writer, empty
    };
    for (const Case& c : cases) {
      std::string line;
      for (const std::string& a : c.args) line += a + " ";
      CAPTURE(line);
      const ProcessResult r = choreo_run(c.args, s.path);
      CHECK(r.exited);
      CHECK(r.exit_code == 2);
      CHECK(r.err.find(c.expected) != std::string::npos);
      if (r.err.find(c.expected) == std::string::npos) MESSAGE(r.err);
    }
  }

  // Tokenising 100 MB took 2.8 GB before the context check (issue 42, finding 8). Now the text's bytes bound
  // its tokens from below (no token spells more bytes than the vocabulary's longest), and the call is refused
  // before tokenising: the peak stays at a few copies of the text (the file, its line, the JSON string, the
  // text with its turn affixes), and nothing is written.
  TEST_CASE("exec: a 100 MB prefill text past the context is refused at the text before it is tokenised") {
    ScratchDir s;
    const fs::path calls = s.path / "calls.jsonl";
    constexpr size_t kTextBytes = size_t(100) << 20;
    {
      std::ofstream file(calls, std::ios::binary);
      file << "{\"op\": \"prefill\", \"id\": \"a\", \"text\": \"";
      const std::string chunk(size_t(1) << 20, 'a');  // written by the MiB: the test's own peak stays small
      for (size_t written = 0; written < kTextBytes; written += chunk.size()) file << chunk;
      file << "\"}\n";
    }
    const ProcessResult r =
        choreo_run({"exec", "-m", testing::shared_file("models/stories260K.gguf"), calls.string()}, s.path);
    CAPTURE(r.err);
    CAPTURE(r.max_rss_kib);
    CHECK(r.exited);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("calls.jsonl:1:") != std::string::npos);
    CHECK(r.err.find("context overflow: the text is 104857600 bytes") != std::string::npos);
    CHECK(size_t(r.max_rss_kib) * 1024 < 6 * kTextBytes);
    CHECK(r.out.empty());
  }
}

}  // namespace
}  // namespace choreo
