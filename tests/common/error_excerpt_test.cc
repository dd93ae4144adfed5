// Errors quote the line they point into. A line can be megabytes long (a whole document in one JSON Lines
// row, a flow-style workflow on one line): the quote is then a window around the column, cut at character
// boundaries and marked with "…", and the caret stays under the located character. Before, the readers
// dropped long lines from the error (or, for workflows and `run --inputs`, printed them whole: 15 MB of
// stderr for a 5 MB row).

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

const std::string kEllipsis = "\u2026";

/// A line built from known characters, so that column c is chars[c - 1] by construction.
struct Line {
  std::vector<std::string> chars;
  std::string text() const {
    std::string out;
    for (const std::string& c : chars) out += c;
    return out;
  }
};

/// Characters of 1 to 4 bytes, chosen at random (fixed seed).
Line random_line(size_t n_chars, uint32_t seed) {
  static const std::vector<std::string> alphabet = {"a", "Z", " ",  "{",  "\"", "é", "ü",
                                                    "ж", "€", "中", "語", "😀",  "𝄞"};
  std::mt19937 rng(seed);
  Line line;
  for (size_t i = 0; i < n_chars; ++i) line.chars.push_back(alphabet[rng() % alphabet.size()]);
  return line;
}

/// The characters of UTF-8 text (a test-side split: every byte that is not 10xxxxxx starts one).
std::vector<std::string> split_chars(const std::string& text) {
  std::vector<std::string> out;
  for (unsigned char c : text) {
    if ((c & 0xC0) != 0x80 || out.empty())
      out.emplace_back(1, char(c));
    else
      out.back() += char(c);
  }
  return out;
}

/// The rendered quote and caret lines of an error: the text after "  | " on the two lines that have it.
struct Rendered {
  std::string quote, caret;
};
Rendered quote_and_caret(const std::string& rendered) {
  Rendered r;
  size_t at = rendered.find("\n  | ");
  REQUIRE(at != std::string::npos);
  size_t end = rendered.find('\n', at + 1);
  r.quote = rendered.substr(at + 5, end - at - 5);
  if (rendered.compare(end, 5, "\n  | ") == 0)
    r.caret = rendered.substr(end + 5, rendered.find('\n', end + 1) - end - 5);
  return r;
}

/// The character the caret of a rendered error points at ("" past the end of the quote).
std::string character_under_caret(const Rendered& r) {
  REQUIRE(!r.caret.empty());
  REQUIRE(r.caret.back() == '^');
  const size_t index = r.caret.size() - 1;  // one blank (or tab) per character before it
  for (char c : r.caret.substr(0, index)) REQUIRE((c == ' ' || c == '\t'));
  const std::vector<std::string> chars = split_chars(r.quote);
  return index < chars.size() ? chars[index] : std::string();
}

TEST_CASE("error excerpt: a short line is quoted whole, the caret under its column") {
  const Line line = random_line(60, 1);
  for (int col : {1, 7, 60, 61}) {
    CAPTURE(col);
    const InputError e("bad", "", SourceLocation{"f.txt", 3, col}, line.text());
    CHECK(e.quoted_line() == line.text());
    const Rendered r = quote_and_caret(e.render());
    CHECK(r.quote == line.text());
    CHECK(character_under_caret(r) == (col <= 60 ? line.chars[col - 1] : std::string()));
  }
}

TEST_CASE("hostile: control characters in a quoted line, message or hint never reach the terminal raw") {
  // ESC ] 52 would set the clipboard, CSI (U+009B) starts a sequence, BEL, DEL: each becomes one visible
  // character, so the caret still stands under the located character (the 'X').
  const std::string line = "a\x1b]52;c;aGk=\x07" "b\xc2\x9b" "c\x7f X";
  const int col = 19;  // a ESC ] 5 2 ; c ; a G k = BEL b CSI c DEL, a blank, X: the X is character 19
  const InputError e("bad \x1b[2J name", "hint \x1b[31m", SourceLocation{"f.txt", 1, col}, line);
  const std::string text = e.render();
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    CHECK_FALSE(((u < 0x20 && c != '\n') || u == 0x7f));
  }
  CHECK(text.find("\xc2\x9b") == std::string::npos);
  CHECK(text.find("\u241B]52") != std::string::npos);  // ESC shown as its control picture
  const Rendered r = quote_and_caret(text);
  CHECK(character_under_caret(r) == "X");
}

TEST_CASE("error excerpt: a long line becomes a bounded window whose caret is on the located character") {
  for (uint32_t seed : {2u, 3u, 4u}) {
    const Line line = random_line(20000, seed);
    const std::string text = line.text();
    for (int col : {1, 2, 50, 119, 120, 121, 122, 500, 10000, 19900, 19999, 20000, 20001}) {
      CAPTURE(seed);
      CAPTURE(col);
      const InputError e("bad", "", SourceLocation{"f.txt", 1, col}, text);
      const std::string& q = e.quoted_line();
      // 2 × 120 bytes of text and two 3-byte markers at most.
      CHECK(q.size() <= 2 * QuotedLine::kQuoteContextBytes + 2 * kEllipsis.size());
      // The text between the markers is a run of whole characters of the line, in place.
      const bool cut_front = q.rfind(kEllipsis, 0) == 0;
      const bool cut_back = q.size() >= 3 && q.compare(q.size() - 3, 3, kEllipsis) == 0;
      const std::string inner =
          q.substr(cut_front ? 3 : 0, q.size() - (cut_front ? 3 : 0) - (cut_back ? 3 : 0));
      const size_t at = text.find(inner);
      REQUIRE(at != std::string::npos);
      CHECK(cut_front == (at > 0));
      CHECK(cut_back == (at + inner.size() < text.size()));
      CHECK(split_chars(inner).size() >= 60);  // at least ~240 bytes of 4-byte characters: context is kept
      // The caret, counted in characters of the quote, is on the character at `col`.
      CHECK(character_under_caret(quote_and_caret(e.render())) ==
            (col <= 20000 ? line.chars[col - 1] : std::string()));
    }
  }
}

TEST_CASE("error excerpt: a 5 MB line renders in a few hundred bytes, tabs before the caret stay tabs") {
  std::string text(5'000'000, 'x');
  text.replace(3'000'000, 3, "\tY\t");
  const InputError e("unexpected Y", "remove it", SourceLocation{"big.jsonl", 1, 3'000'002}, text);
  const std::string out = e.render();
  CHECK(out.size() < 700);
  CHECK(out.find("big.jsonl:1:3000002: unexpected Y") != std::string::npos);
  const Rendered r = quote_and_caret(out);
  CHECK(character_under_caret(r) == "Y");
  CHECK(r.caret.find('\t') != std::string::npos);  // aligned under the tab, whatever its width
}

TEST_CASE("error excerpt: without a column the start of the line is quoted, with no caret") {
  const std::string text(100000, 'q');
  const InputError e("bad row", "", SourceLocation{"f.jsonl", 9, 0}, text);
  CHECK(e.quoted_line() == std::string(2 * QuotedLine::kQuoteContextBytes, 'q') + kEllipsis);
  CHECK(e.render().find('^') == std::string::npos);
}

TEST_CASE("error excerpt: with_message keeps the excerpt, the caret and the hint") {
  const Line line = random_line(5000, 5);
  const InputError e("inner", "the hint", SourceLocation{"w.yaml", 4, 2500}, line.text());
  const InputError wrapped = e.with_message("in branch x = 1: inner");
  CHECK(wrapped.message() == "in branch x = 1: inner");
  CHECK(wrapped.hint() == "the hint");
  CHECK(wrapped.where().col == 2500);
  CHECK(wrapped.quoted_line() == e.quoted_line());
  CHECK(character_under_caret(quote_and_caret(wrapped.render())) == line.chars[2499]);
}

TEST_CASE("error excerpt: columns count characters, clipping never splits one") {
  const std::string text = "aé中😀b";  // 1 + 2 + 3 + 4 + 1 bytes
  CHECK(column_at_byte(text, 0) == 1);
  CHECK(column_at_byte(text, 1) == 2);
  CHECK(column_at_byte(text, 3) == 3);
  CHECK(column_at_byte(text, 6) == 4);
  CHECK(column_at_byte(text, 10) == 5);
  CHECK(column_at_byte(text, 11) == 6);
  CHECK(column_at_byte(text, 999) == 6);
  for (size_t max = 0; max <= text.size(); ++max) {
    CAPTURE(max);
    const std::string clipped = clip_text(text, max);
    const std::string kept = max >= text.size() ? clipped : clipped.substr(0, clipped.size() - 3);
    CHECK(kept.size() <= max);
    CHECK(text.rfind(kept, 0) == 0);
    CHECK(column_at_byte(text, kept.size()) - 1 == int(split_chars(kept).size()));  // whole characters
  }
  // Messages and hints that carry a value from the input (a key given twice) are cut too.
  const InputError e(std::string(1 << 20, 'k'), std::string(1 << 20, 'h'));
  CHECK(std::string(e.what()).size() <= InputError::kMaxMessageBytes + 3);
  CHECK(e.hint().size() <= InputError::kMaxMessageBytes + 3);
}

TEST_SUITE("hostile") {
  /// Runs the real binary; the error it prints must be short and point at the right character.
  void check_located_error(const std::vector<std::string>& args, const std::string& file, int line, int col,
                           const std::string& expected_char, const fs::path& scratch) {
    const std::string binary = testing::choreo_binary();
    REQUIRE_MESSAGE(fs::exists(binary), "no choreo binary at ", binary, " (build it, or set CHOREO_BIN)");
    const testing::ProcessResult r = testing::run_process(binary, args, scratch);
    CHECK(r.exited);
    CHECK(r.exit_code == 2);
    CHECK(r.err.size() < 800);
    CAPTURE(r.err.substr(0, 2000));
    CHECK(r.err.find(fmt::format("{}:{}:{}: ", file, line, col)) != std::string::npos);
    CHECK(character_under_caret(quote_and_caret(r.err)) == expected_char);
  }

  TEST_CASE("error excerpt: a 5 MB JSON Lines row with a syntax error gives a short error at the character") {
    testing::ScratchDir scratch;
    const fs::path workflow = scratch.path / "w.yaml", rows = scratch.path / "rows.jsonl";
    std::ofstream(workflow)
        << "name: w\ninputs: {problem: string}\nmessages:\n  a: {text: \"{{ problem }}\"}\n"
           "steps:\n  - decode: {as: b, parents: [a], header: \"There\", max_tokens: 2}\n";
    // Two-byte characters, so a byte column would point far past the error: the column counts characters.
    std::string prefix = "{\"problem\": \"";
    for (int i = 0; i < 2'500'000; ++i) prefix += "é";
    prefix += "\", ";
    std::ofstream(rows) << "{\"problem\": \"fine\"}\n" << prefix << "oops: 1}\n";
    const int col = column_at_byte(prefix, prefix.size());
    CHECK(col == 13 + 2'500'000 + 3 + 1);
    check_located_error({"run", workflow.string(), "-m", testing::shared_file("models/stories260K.gguf"),
                         "--inputs", rows.string()},
                        rows.string(), 2, col, "o", scratch.path);
  }

  TEST_CASE(
      "error excerpt: a 3 MB one-line workflow with an unknown parent gives a short error at the name") {
    testing::ScratchDir scratch;
    const fs::path workflow = scratch.path / "w.yaml";
    std::string prefix = "{name: w, description: \"";
    for (int i = 0; i < 1'000'000; ++i) prefix += "ü";
    prefix += "\", messages: {a: {text: hi}}, steps: [{decode: {as: b, header: x, max_tokens: 2, parents: [";
    std::ofstream(workflow) << prefix << "nosuch]}}]}\n";
    check_located_error({"check", workflow.string()}, workflow.string(), 1,
                        column_at_byte(prefix, prefix.size()), "n", scratch.path);
  }
}

}  // namespace
}  // namespace choreo
