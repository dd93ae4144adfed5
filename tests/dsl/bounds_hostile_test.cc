// Hostile depth and work (issue 16): values nested far past the limit (built by a loop, or read from JSON
// lines), loop nests of 10^9 iterations, lists doubled until their written-out size is astronomical, fan-outs
// of 10^5 branches and a 3 MB PML schema. Each once crashed the binary (stack overflow), hung it, or took
// minutes; now each is an error at file:line:col with exit code 2, or finishes in well under its time limit.
// The real binary runs each case that could crash or hang, under `timeout`.

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dsl/budget.h"
#include "dsl/expr/value.h"
#include "dsl/pml/schema_parser.h"
#include "runtime/exec/json_line.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

constexpr int kTimeoutSeconds = 60;

/// Runs the choreo binary with `args` under `timeout` (a hang ends with exit code 124).
testing::ProcessResult run_choreo(const std::vector<std::string>& args, const testing::ScratchDir& scratch,
                                  int timeout_seconds = kTimeoutSeconds) {
  const std::string binary = testing::choreo_binary();
  REQUIRE_MESSAGE(fs::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
  std::vector<std::string> all = {std::to_string(timeout_seconds), binary};
  all.insert(all.end(), args.begin(), args.end());
  return testing::run_process("/usr/bin/timeout", all, scratch.path);
}

/// The run ended by itself with exit code 2 and an error naming `where` (file:line:col) and `message`.
void check_input_error(const testing::ProcessResult& r, const std::string& where, const std::string& message) {
  CAPTURE(r.err.substr(0, 2000));
  CHECK(r.exited);
  CHECK(r.exit_code == 2);  // not 124 (timed out) nor a signal
  CHECK(r.err.find("error: " + where + ": ") != std::string::npos);
  CHECK(r.err.find(message) != std::string::npos);
  CHECK(r.err.find("hint: ") != std::string::npos);
}

std::string write(const testing::ScratchDir& scratch, const std::string& name, const std::string& text) {
  const fs::path path = scratch.path / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string stories() { return testing::shared_file("models/stories260K.gguf"); }

/// A workflow whose `let` wraps x in one more list on each of `iterations` iterations (line 7, column 19).
std::string deepening_workflow(int iterations, const std::string& text) {
  return "name: deep\nmessages:\n  m: {text: \"Once upon a time\"}\nsteps:\n  - repeat: \"i in range(" +
         std::to_string(iterations) + ")\"\n    steps:\n      - let: {x: \"[x] if i > 0 else []\"}\n" +
         "  - prefill: {as: p, text: \"" + text + "\", parents: [m]}\n";
}

/// 1 + `n` levels of JSON: an object whose field `key` holds `n` nested lists (or objects).
std::string deep_json_row(const std::string& fields, const std::string& key, int n, bool objects) {
  std::string open, close;
  for (int i = 0; i < n; ++i) {
    open += objects ? "{\"a\": " : "[";
    close += objects ? "}" : "]";
  }
  return "{" + fields + "\"" + key + "\": " + open + (objects ? "1" : "") + close + "}\n";
}

/// The 1-based column of the bracket that opens JSON level kMaxValueDepth + 1 in `row`, counted independently.
int first_too_deep_column(const std::string& row) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < row.size(); ++i) {
    if (in_string) {
      if (row[i] == '\\') ++i;
      else if (row[i] == '"') in_string = false;
    } else if (row[i] == '"') {
      in_string = true;
    } else if ((row[i] == '[' || row[i] == '{') && ++depth > dsl::expr::kMaxValueDepth) {
      return int(i) + 1;
    } else if (row[i] == ']' || row[i] == '}') {
      --depth;
    }
  }
  return 0;
}

/// Runs `body` in a child process that SIGALRM kills after `seconds`: true when it finished in time.
bool finishes_within(unsigned seconds, const std::function<void()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(seconds);
    try {
      body();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

TEST_SUITE("hostile") {

TEST_CASE("a list built 200,000 deep by a let in a repeat is an error at the let, for check and run") {
  testing::ScratchDir scratch;
  const std::string workflow = write(scratch, "deep.yaml", deepening_workflow(200000, "x"));
  const std::string message = fmt::format("nest lists and dicts more than {} levels deep", dsl::expr::kMaxValueDepth);
  check_input_error(run_choreo({"check", workflow}, scratch), workflow + ":7:19", message);
  check_input_error(run_choreo({"run", "-m", stories(), workflow}, scratch), workflow + ":7:19", message);
}

TEST_CASE("a list 60,000 deep is never rendered: the let that would build it fails first") {
  testing::ScratchDir scratch;
  const std::string workflow = write(scratch, "render.yaml", deepening_workflow(60000, "{{ x }}"));
  check_input_error(run_choreo({"run", "-m", stories(), workflow}, scratch), workflow + ":7:19", "levels deep");
}

TEST_CASE("a JSON-lines row nested 100,000 deep is rejected at its bracket by run --inputs and eval") {
  testing::ScratchDir scratch;
  const std::string workflow = write(scratch, "w.yaml",
                                     "name: w\ninputs: {question: list}\nmessages:\n  m: {text: \"Once\"}\nsteps:\n"
                                     "  - decode: {as: a, parents: [m], header: \" a\", max_tokens: 1}\n"
                                     "output: \"{{ a }}\"\n");
  for (bool objects : {false, true}) {
    CAPTURE(objects);
    const std::string row = deep_json_row("\"answer\": \"1\", ", "question", 100000, objects);
    const std::string rows = write(scratch, "rows.jsonl", row);
    const std::string where = fmt::format("{}:1:{}", rows, first_too_deep_column(row));
    const std::string message = fmt::format("nest more than {} levels deep", dsl::expr::kMaxValueDepth);
    check_input_error(run_choreo({"run", "-m", stories(), workflow, "--inputs", rows}, scratch), where, message);
    // eval writes nothing: neither its results file nor anything beside it.
    const std::string out = (scratch.path / "results.jsonl").string();
    const std::string decoy = write(scratch, "decoy.jsonl", "{\"keep\": true}\n");
    check_input_error(run_choreo({"eval", workflow, "--data", rows, "--format", "jsonl", "--metric", "qa_f1", "-m",
                                  stories(), "--out", out},
                                 scratch),
                      where, message);
    CHECK(!fs::exists(out));
    CHECK(testing::read_file(decoy) == "{\"keep\": true}\n");
  }
}

TEST_CASE("JSON lines: the deepest allowed row parses, one level more is an error at its bracket") {
  for (int n : {dsl::expr::kMaxValueDepth - 1, dsl::expr::kMaxValueDepth}) {
    const std::string row = deep_json_row("\"s\": \"[[[\\\"\", ", "x", n, n % 2 == 0);  // brackets in a string
    const exec::JsonLine line = exec::parse_json_line(3, row);
    if (1 + n <= dsl::expr::kMaxValueDepth) {
      CHECK(line.json_error.empty());
      CHECK(line.value.is_object());
    } else {
      CHECK(line.json_error.find("levels deep") != std::string::npos);
      CHECK(line.json_error_byte == size_t(first_too_deep_column(row)));
    }
  }
}

TEST_CASE("three nested repeats over range(1000) stop at the work bound, at a loop, for check and run") {
  testing::ScratchDir scratch;
  const std::string workflow = write(scratch, "work.yaml",
                                     "name: work\nmessages:\n  m: {text: \"Once\"}\nsteps:\n"
                                     "  - repeat: \"i in range(1000)\"\n    steps:\n"
                                     "      - repeat: \"j in range(1000)\"\n        steps:\n"
                                     "          - repeat: \"k in range(1000)\"\n            steps:\n"
                                     "              - let: {n: \"i + j + k\"}\n");
  // The inner loop spends 1000 steps per middle iteration: the bound runs out in a middle iteration.
  const std::string message = fmt::format("work bound of {} steps", dsl::kDefaultMaxSteps);
  check_input_error(run_choreo({"check", workflow}, scratch), workflow + ":7:18", message);
  check_input_error(run_choreo({"run", "-m", stories(), workflow}, scratch), workflow + ":7:18", message);
  // A smaller bound stops it sooner: in the first inner loop.
  check_input_error(run_choreo({"check", workflow, "--max-steps", "500"}, scratch), workflow + ":9:22",
                    "work bound of 500 steps");
}

TEST_CASE("--max-steps bounds run, check, profile and eval alike") {
  testing::ScratchDir scratch;
  // Two calls: a bound of 2 passes, a bound of 1 stops at the second (the decode on line 7).
  const std::string workflow = write(scratch, "f.yaml",
                                     "name: f\ninputs: {question: string}\nmessages:\n  m: {text: \"Once upon a time\"}\n"
                                     "steps:\n  - prefill: {as: q, text: \"{{ question }}\", parents: [m]}\n"
                                     "  - decode: {as: a, parents: [m, q], header: \" a\", max_tokens: 1}\n"
                                     "output: \"{{ a }}\"\n");
  const std::string data = write(scratch, "f.jsonl", "{\"question\": \"x\", \"answer\": \"1\"}\n");
  const std::vector<std::vector<std::string>> commands = {
      {"check", workflow},
      {"run", "-m", stories(), workflow, "--input", "question=x"},
      {"profile", "-m", stories(), workflow, "--input", "question=x"},
      {"eval", workflow, "--data", data, "--format", "jsonl", "--metric", "qa_f1", "-m", stories(), "--out",
       (scratch.path / "out.jsonl").string()},
  };
  for (std::vector<std::string> command : commands) {
    CAPTURE(command[0]);
    command.insert(command.end(), {"--max-steps", "1"});
    check_input_error(run_choreo(command, scratch), workflow + ":7:5", "work bound of 1 step ");
    fs::remove(scratch.path / "out.jsonl");
    command.back() = "2";
    const testing::ProcessResult ok = run_choreo(command, scratch);
    CAPTURE(ok.err);
    CHECK(ok.exit_code == 0);
  }
}

TEST_CASE("a list doubled by a let 64 times stops at the element limit instead of taking 2^64 steps") {
  testing::ScratchDir scratch;
  const std::string workflow = write(scratch, "double.yaml",
                                     "name: double\nmessages:\n  m: {text: \"Once\"}\nsteps:\n"
                                     "  - repeat: \"i in range(64)\"\n    steps:\n"
                                     "      - let: {x: \"[x, x] if i > 0 else [m]\"}\n"
                                     "  - decode: {as: d, parents: [x], header: \" a\", max_tokens: 1}\n");
  const std::string message = fmt::format("more than {} elements", dsl::expr::kMaxValueElements);
  check_input_error(run_choreo({"check", workflow}, scratch), workflow + ":7:19", message);
  check_input_error(run_choreo({"run", "-m", stories(), workflow}, scratch), workflow + ":7:19", message);
}

TEST_CASE("a field message whose value would render to terabytes is an error at the field, for check and run") {
  testing::ScratchDir scratch;
  const std::string workflow = write(scratch, "field.yaml",
                                     "name: f\ninputs: {q: list}\nmessages:\n  m: {field: q}\nsteps:\n"
                                     "  - decode: {as: a, parents: [m], header: \" a\", max_tokens: 1}\n");
  // 10^6 references to one 16 MB string: cheap to hold, 16 TB to write out. The address-space cap keeps a
  // binary that tries anyway from taking the machine's memory with it.
  const std::string input = "q=['x' * 16000000] * 1000000";
  for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
           {"check", workflow, "--input", input}, {"run", "-m", stories(), workflow, "--input", input}}) {
    std::vector<std::string> capped = {"--as=8000000000", "--", "/usr/bin/timeout", std::to_string(kTimeoutSeconds),
                                       testing::choreo_binary()};
    capped.insert(capped.end(), command.begin(), command.end());
    check_input_error(testing::run_process("/usr/bin/prlimit", capped, scratch.path), workflow + ":4:14",
                      "renders to more than 16777216 bytes");
  }
}

TEST_CASE("check binds fan-outs of 100,000 branches without copying the list per branch") {
  testing::ScratchDir scratch;
  // Copying the list per branch was 2 x 5 * 10^9 element copies (~50 s); once per batch it is 2 * 10^5 (~1 s).
  const std::string workflow = write(scratch, "fan.yaml",
                                     "name: fan\nmessages:\n  m: {text: \"Once\"}\nsteps:\n"
                                     "  - prefill: {as: \"a[i]\", for: \"i in range(100000)\", text: \"x\", parents: [m]}\n"
                                     "  - prefill: {as: \"b[i]\", for: \"i in range(100000)\", text: \"y\", parents: [m]}\n");
  const testing::ProcessResult r = run_choreo({"check", workflow}, scratch, 20);
  CAPTURE(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("200000 call(s)") != std::string::npos);  // every branch is in the plan
}

TEST_CASE("a 3 MB PML schema parses in a moment, not minutes") {
  // Thousands of modules with text, entities, comments and parameters, on long lines and short ones.
  std::string text = "<schema name=\"big\">\n<system>You are helpful &amp; brief.</system>\n<union>\n";
  int modules = 0;
  while (text.size() < (3u << 20)) {
    text += fmt::format("<module name=\"m{}\">Passage {} &lt;x&gt;<!-- note --> <parameter name=\"p\" length=\"4\"/> "
                        "the quick brown fox{}</module>",
                        modules, modules, modules % 7 == 0 ? "\n" : " ");
    ++modules;
  }
  text += "\n</union>\n<user>Question?</user>\n</schema>\n";
  // Quadratic in the document's size, this took over two minutes; linear, it takes well under a second.
  CHECK(finishes_within(kTimeoutSeconds, [&] { (void)dsl::pml::parse_schema(text, "big.pml"); }));
  const dsl::pml::Schema schema = dsl::pml::parse_schema(text, "big.pml");
  const dsl::pml::Union* u = nullptr;
  for (const dsl::pml::Node& node : schema.body)
    if (const auto* found = std::get_if<dsl::pml::Union>(&node.value)) u = found;
  REQUIRE(u);
  CHECK(int(u->members.size()) == modules);
  // Module m sits on line 4 + ceil(m / 7) (a newline follows every seventh): the line index counts right.
  const int last = modules - 1;
  CHECK(u->members.back().where.line == 4 + (last + 6) / 7);
}

}  // TEST_SUITE("hostile")

}  // namespace choreo
