// Model text on a terminal (common/terminal_text.h). A model can write ESC ] 52 (set the clipboard),
// ESC [ 2J, CSI as U+009B, BEL, DEL or CR, and a terminal would obey them: `choreo generate` and `choreo run`
// escape them when stdout is a terminal and pass the exact bytes to a pipe or file. The end-to-end cases run
// the real binary on a pseudo-terminal with a model built here whose greedy continuation is exactly such a
// byte string, one byte token at a time, so UTF-8 characters arrive split across tokens.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/terminal_text.h"
#include "runtime/model/gguf.h"
#include "runtime/model/synth.h"
#include "runtime/model/vocab.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

TEST_CASE("terminal escaping: controls, DEL, C1 and broken UTF-8 become visible text, the rest passes") {
  const std::map<std::string, std::string> cases = {
      {"plain text\twith a tab\nand a newline", "plain text\twith a tab\nand a newline"},
      {"\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"},
      {"\x1b[2J", "\\x1b[2J"},
      {"a\rb\bc\x7f", "a\\x0db\\x08c\\x7f"},
      {std::string("nul\0byte", 8), "nul\\x00byte"},
      {"\xc2\x9b"
       "31m \xc2\x85 \xc2\x9f",
       "\\u009b31m \\u0085 \\u009f"},          // C1 controls, as characters
      {"\xc2\xa0 é 中 😀", "\xc2\xa0 é 中 😀"},  // U+00A0 and beyond pass
      {"\x9b"
       "1m",
       "\\x9b1m"},  // a lone continuation byte
      {"\xc0\x80 \xed\xa0\x80 \xf4\x90\x80\x80",
       "\\xc0\\x80 \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80"},  // overlong, surrogate, >U+10FFFF
      {"end \xe4\xb8", "end \\xe4\\xb8"},                   // cut off at the end of the text
      // Bidirectional controls reorder what a terminal shows (Trojan Source): RLO, LRI, PDI, RLM, ALM.
      {"if \xe2\x80\xae{ admin }\xe2\x81\xa6x\xe2\x81\xa9 \xe2\x80\x8f \xd8\x9c",
       "if \\u202e{ admin }\\u2066x\\u2069 \\u200f \\u061c"},
      {"\xe2\x80\x8b \xe2\x80\xaf", "\xe2\x80\x8b \xe2\x80\xaf"},  // U+200B, U+202F are not controls
  };
  for (const auto& [text, expected] : cases) {
    CAPTURE(text);
    CHECK(escape_for_terminal(text) == expected);
  }
}

TEST_CASE("terminal escaping: text fed in pieces escapes exactly as the whole, however it is split") {
  const std::string text =
      "a\xc2\x9b"
      "b é\x1b[0m 中😀 \xe4\xb8 \xf0\x9f\x98 x\xc3";
  const std::string whole = escape_for_terminal(text);
  // Every split into three pieces, including splits inside every multi-byte sequence.
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      TerminalEscaper e;
      std::string out = e.feed(text.substr(0, i));
      out += e.feed(text.substr(i, j - i));
      out += e.feed(text.substr(j));
      out += e.finish();
      CAPTURE(i);
      CAPTURE(j);
      REQUIRE(out == whole);
    }
  // A character split across pieces is held back, not escaped byte by byte.
  TerminalEscaper e;
  CHECK(e.feed("x\xc3") == "x");
  CHECK(e.feed("\xa9") == "é");
  CHECK(e.feed("\xc2") == "");
  CHECK(e.feed("\x9b") == "\\u009b");
  CHECK(e.finish() == "");
}

/// The bytes the model below writes, one byte token each: an OSC 52 clipboard write, CSI as U+009B (split
/// over two tokens), é (split over two tokens), DEL and CR. Every byte differs from the others, because each
/// token's successor is chosen by that token alone.
const std::string kHostileBytes =
    "\x1b]52;c\x07\xc2\x9b"
    "A\xc3\xa9\x7f\rZ";
/// What a terminal is shown instead.
const std::string kShownBytes = "\\x1b]52;c\\x07\\u009bAé\\x7f\\x0dZ";

/// Writes a model whose greedy continuation after the prompt "Q" is kHostileBytes, then end of generation.
/// Every layer's matrices are zero, so the last hidden state is the last token's embedding: token t's
/// embedding is a unit vector of its own, and the output row of its successor is that vector scaled up.
void write_successor_model(const fs::path& path) {
  model::SynthShape shape{.name = "successor",
                          .embedding_length = 64,
                          .block_count = 1,
                          .head_count = 4,
                          .head_count_kv = 2,
                          .feed_forward_length = 96,
                          .vocab_size = 1200,
                          .context_length = 256,
                          .tied_embeddings = false,
                          .vocab = model::SynthVocab::ChatML};
  const fs::path random = path.string() + ".random";
  model::write_synthetic_model(shape, kernels::DType::F32, random.string(), 1);
  gguf::File source = gguf::File::open(random.string());
  const int64_t dim = shape.embedding_length, vocab = shape.vocab_size;
  // The synthetic vocabulary's byte tokens: id b is byte b (runtime/model/synth.h).
  std::vector<int64_t> chain = {'Q'};
  for (unsigned char b : kHostileBytes) chain.push_back(b);
  chain.push_back(source.get_int("tokenizer.ggml.eos_token_id", -1));
  REQUIRE(chain.back() > 255);
  std::vector<float> embd(size_t(dim * vocab), 0.0f), output(size_t(dim * vocab), 0.0f);
  for (size_t slot = 0; slot + 1 < chain.size(); ++slot) {
    embd[size_t(chain[slot] * dim) + slot] = 1.0f;
    output[size_t(chain[slot + 1] * dim) + slot] = 10.0f;
  }
  gguf::Writer w(source.alignment());
  for (const auto& [key, value] : source.metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : source.tensors()) {
    std::vector<float> values(size_t(t.n_elements()), 0.0f);
    if (t.name == "token_embd.weight") values = embd;
    if (t.name == "output.weight") values = output;
    if (t.name.find("norm") != std::string::npos) values.assign(values.size(), 1.0f);
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    w.add_tensor(t.name, t.shape, t.type, std::move(bytes));
  }
  w.write(path.string());
  fs::remove(random);
}

/// Runs `binary args...` with its stdout on a pseudo-terminal (raw mode: bytes arrive unchanged; stderr goes
/// to /dev/null) and returns what it wrote there; fails the test if it runs for more than a minute, dies by a
/// signal or exits with an error.
std::string run_on_terminal(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> strings{binary};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  termios raw{};
  cfmakeraw(&raw);
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, &raw, nullptr);
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      FAIL("the command ran for more than a minute");
      break;
    }
    if (poll(&p, 1, 1000) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(master, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO once the child has closed the terminal
    out.append(buffer, size_t(n));
  }
  close(master);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return out;
}

/// Checks that every ESC in `out` starts an SGR colour sequence (ESC [ digits/semicolons m) of our own.
bool only_colour_escapes(const std::string& out) {
  for (size_t at = out.find('\x1b'); at != std::string::npos; at = out.find('\x1b', at + 1)) {
    if (at + 1 >= out.size() || out[at + 1] != '[') return false;
    size_t k = at + 2;
    while (k < out.size() && (std::isdigit(static_cast<unsigned char>(out[k])) || out[k] == ';')) ++k;
    if (k >= out.size() || out[k] != 'm') return false;
  }
  return true;
}

/// No raw control the model wrote reached the terminal: no BEL, DEL, CR, C1 control or stray ESC.
void check_terminal_safe(const std::string& out) {
  CHECK(out.find('\x07') == std::string::npos);
  CHECK(out.find('\x7f') == std::string::npos);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find("\xc2\x9b") == std::string::npos);
  CHECK(only_colour_escapes(out));
}

TEST_SUITE("hostile") {
  TEST_CASE("terminal: generate and run escape a model's control bytes on a terminal, pass them to a file") {
    const std::string binary = testing::choreo_binary();
    REQUIRE_MESSAGE(fs::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
    testing::ScratchDir scratch;
    const fs::path model = scratch.path / "successor.gguf";
    write_successor_model(model);
    const fs::path workflow = scratch.path / "w.yaml";
    std::ofstream(workflow)
        << "name: w\nmessages:\n  a: {text: \"Q\"}\n"
           "steps:\n  - decode: {as: b, parents: [a], header: \"Q\", max_tokens: 40, temperature: 0}\n"
           "output: \"{{ b }}\"\n";
    const std::vector<std::string> generate = {"generate", "-m", model.string(), "-p", "Q",
                                               "--temp",   "0",  "-t",           "1"};
    const std::vector<std::string> run = {"run", workflow.string(), "-m", model.string(), "-t",
                                          "1",   "--no-store"};

    SUBCASE("to a file: the exact bytes") {
      testing::ProcessResult g = testing::run_process(binary, generate, scratch.path);
      CAPTURE(g.err);
      CHECK(g.exit_code == 0);
      CHECK(g.out == kHostileBytes + "\n");  // not vacuous: the model really writes these bytes
      testing::ProcessResult r = testing::run_process(binary, run, scratch.path);
      CAPTURE(r.err);
      CHECK(r.exit_code == 0);
      CHECK(r.out.find(kHostileBytes + "\n") != std::string::npos);               // streamed
      CHECK(r.out.find("output\n" + kHostileBytes + "\n") != std::string::npos);  // and the output
    }
    SUBCASE("to a terminal: escaped, characters split across tokens kept whole") {
      const std::string g = run_on_terminal(binary, generate);
      CAPTURE(g);
      CHECK(g == kShownBytes + "\n");
      check_terminal_safe(g);
      const std::string r = run_on_terminal(binary, run);
      CAPTURE(r);
      CHECK(r.find(kShownBytes + "\n") != std::string::npos);
      CHECK(r.find("output\x1b[0m\n" + kShownBytes + "\n") != std::string::npos);
      check_terminal_safe(r);
    }
  }
}

}  // namespace
}  // namespace choreo
