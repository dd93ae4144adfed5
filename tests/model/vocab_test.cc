// Tokenizers: llama.cpp's conformance files (ggml-vocab-*.gguf + .inp/.out), llama.cpp itself (through
// llama-cpp-python) on tricky strings, brute-force re-computations of the merge rules on synthetic
// vocabularies, the detokenization round trip, and the errors bad vocabulary metadata must produce.

#include "runtime/model/vocab.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "common/error.h"
#include "runtime/model/gguf.h"
#include "tests/reference/reference.h"
#include "tests/test_paths.h"

using choreo::InputError;
using choreo::gguf::File;
using choreo::gguf::Writer;
using choreo::model::Token;
using choreo::model::Vocab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// One case of a .inp/.out pair.
struct ConformanceCase {
  std::string text;
  std::vector<Token> expected;
};

/// Splits the files exactly as llama.cpp's tests/test-tokenizer-0.cpp does: inputs are separated by
/// "\n__ggml_vocab_test__\n" (no trimming), outputs are one line of space-separated ids per input.
std::vector<ConformanceCase> read_cases(const fs::path& vocab_path) {
  const std::string inputs = read_text(vocab_path.string() + ".inp");
  const std::string outputs = read_text(vocab_path.string() + ".out");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t at = 0; at < inputs.size();) {
    const size_t next = inputs.find(separator, at);
    if (next == std::string::npos) {
      texts.push_back(inputs.substr(at));
      break;
    }
    texts.push_back(inputs.substr(at, next - at));
    at = next + separator.size();
  }
  std::vector<std::vector<Token>> expected;
  std::istringstream lines(outputs);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ids(line);
    expected.emplace_back();
    for (Token id; ids >> id;) expected.back().push_back(id);
  }
  REQUIRE_MESSAGE(texts.size() == expected.size(), vocab_path.string(),
                  ": .inp and .out disagree on the count");
  std::vector<ConformanceCase> cases;
  for (size_t i = 0; i < texts.size(); ++i) cases.push_back({texts[i], expected[i]});
  return cases;
}

std::vector<fs::path> conformance_vocabs() {
  const fs::path dir = choreo::testing::shared_dir() / "models" / "vocab";
  std::vector<fs::path> paths;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("ggml-vocab-", 0) == 0 && entry.path().extension() == ".gguf")
        paths.push_back(entry.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty())
    FAIL("no ggml-vocab-*.gguf under ", dir.string(), " — set CHOREO_SHARED to the shared/ directory");
  return paths;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t at = 0;;) {
    const size_t found = text.find(from, at);
    out.append(text.substr(at, found == std::string_view::npos ? std::string_view::npos : found - at));
    if (found == std::string_view::npos) return out;
    out.append(to);
    at = found + from.size();
  }
}

std::string ids_to_string(const std::vector<Token>& ids) { return fmt::format("[{}]", fmt::join(ids, ", ")); }

/// Runs tests/reference/tokenize_ref.py (llama.cpp through llama-cpp-python) on `cases`.
json llama_cpp_reference(const std::string& model, const json& cases, bool with_pieces) {
  choreo::testing::ScratchDir dir;
  const fs::path input = dir.path / "cases.json";
  std::ofstream(input) << json{{"cases", cases}, {"with_pieces", with_pieces}}.dump();
  return json::parse(choreo::testing::run_reference_script("tokenize_ref.py", {model, input.string()}, dir.path));
}

std::string hex(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) out += fmt::format("{:02x}", uint8_t(c));
  return out;
}

/// Strings that exercise pre-tokenizer corners: contractions in any case, digit runs, whitespace runs and
/// exotic spaces, scripts without spaces, combining marks, emoji sequences, code, unassigned code points.
const std::vector<std::string> kTrickyStrings = {
    "Hello world",
    " Hello world",
    "Hello, y'all! How're you? I'm fine; they'd've gone.",
    "DON'T WE'LL THEY'VE I'M SHE'S IT'D YOU'RE 'Tis 'S 'Re 'Ll",
    "3 33 333 3333 12345678901 1.5e10 + 2,000,000",
    "٣٤٥ ١٢ ½ ² Ⅻ ௰",
    "a  b   c    d",
    "a   \n\n  b\t\tc \t \n",
    "line1\r\nline2\r\n\r\n",
    "   ",
    "\n\n\n",
    "trailing spaces   ",
    "x \u00a0 y\u3000z\u2003w",
    "a\u0085b\u180Ec\u200Bd\u2028e",
    "Führer Ελληνικά нещо на Български",
    "東京タワー 한국어 텍스트 我想在apple工作1314151天～",
    "e\u0301 n\u0303 ﬁ ligature",
    "🦙🚀 😶‍🌫️ 👨‍👩‍👧 ❤️ ✅",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
    "def f(x):\n    return x**2  # square\n\n\tpass\n",
    "if (a && b) { c->d[i] = e; } // done",
    "<div class=\"x\">&amp;</div> $HOME/~user; echo `ls` | grep -v ^#",
    "\x01\x02 \x7f controls",
    "unassigned \U000E0080\U000E0081 x a\uFFFFb \u0378!",
    "private \uE000\uE001 use",
    "õ÷Áýÿ À",
    "!!!!!!!!!! ............ ???",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <s> x </s>",
    "",
};

/// Random strings of pieces chosen to collide in the pre-tokenizers: apostrophes before letters of both
/// cases, mixed scripts, exotic spaces, unassigned and private code points, special-token texts.
std::vector<std::string> random_strings(uint32_t seed, int count) {
  static const std::vector<std::string> atoms = {"a",          "b",      "X",          "Z",
                                                 " ",          "  ",     "   ",        "0",
                                                 "1",          "9",      "'",          "\n",
                                                 "\r",         "\t",     ".",          ",",
                                                 "!",          "?",      "-",          "_",
                                                 "(",          ")",      "[",          "]",
                                                 "{",          "}",      "<",          ">",
                                                 "/",          "\\",     "\"",         "#",
                                                 "$",          "%",      "&",          "*",
                                                 "+",          "=",      ":",          ";",
                                                 "@",          "^",      "`",          "|",
                                                 "~",          "\n\n",   " \n",        "'s",
                                                 "'S",         "'ll",    "'RE",        "'ve",
                                                 "'d",         "'M",     "'t",         "é",
                                                 "ß",          "Ж",      "λ",          "中",
                                                 "文",         "ア",     "한",         "ก",
                                                 "ि",          "\u0301", "\u00a0",     "\u3000",
                                                 "\u2003",     "\u0085", "\u200b",     "\u2028",
                                                 "\u180e",     "\u1680", "٣",          "½",
                                                 "²",          "Ⅻ",      "🦙",       "😶‍🌫️",
                                                 "❤️",     "\ufe0f", "\U000E0080", "\uFFFF",
                                                 "\uE000",     "\x01",   "\x7f",       "<|im_start|>",
                                                 "<|im_end|>", "<s>",    "</s>",       "<|endoftext|>",
                                                 "õ",          "÷",      "À",          "Ġ",
                                                 "▁",          "ﬁ",      "K",          "ſ"};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, atoms.size() - 1);
  std::uniform_int_distribution<int> length(1, 25);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string text;
    for (int n = length(rng); n > 0; --n) text += atoms[pick(rng)];
    out.push_back(text);
  }
  return out;
}

/// Compares our vocabulary with llama.cpp's: tokenization of kTrickyStrings and random strings (three flag
/// combinations each), every token's piece (special and plain) when `with_pieces`, the EOG and control sets.
void check_against_llama_cpp(const std::string& model_path, bool with_pieces = true) {
  const Vocab vocab = Vocab::from_gguf(File::open(model_path));
  json cases = json::array();
  struct Flags {
    bool add_special, parse_special;
  };
  const std::vector<Flags> flag_sets = {{false, false}, {true, false}, {false, true}};
  std::vector<std::string> texts = kTrickyStrings;
  for (const std::string& text : random_strings(42, 150)) texts.push_back(text);
  for (const std::string& text : texts) {
    for (const Flags flags : flag_sets) {
      cases.push_back(
          {{"text", text}, {"add_special", flags.add_special}, {"parse_special", flags.parse_special}});
    }
  }
  const json reference = llama_cpp_reference(model_path, cases, with_pieces);
  REQUIRE(reference["n_tokens"].get<int>() == vocab.n_tokens());

  int n_token_cases = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i]["text"];
    const bool add_special = cases[i]["add_special"];
    const bool parse_special = cases[i]["parse_special"];
    const std::vector<Token> ours = vocab.tokenize(text, add_special, parse_special);
    const std::vector<Token> theirs = reference["tokens"][i].get<std::vector<Token>>();
    CHECK_MESSAGE(ours == theirs, model_path, " text ", json(text).dump(), " add_special=", add_special,
                  " parse_special=", parse_special, "\n ours:      ", ids_to_string(ours),
                  "\n llama.cpp: ", ids_to_string(theirs));
    ++n_token_cases;
  }

  int n_piece_mismatches = 0;
  for (Token id = 0; with_pieces && id < vocab.n_tokens(); ++id) {
    const bool same =
        hex(vocab.token_to_piece(id, true)) == reference["pieces"][size_t(id)].get<std::string>() &&
        hex(vocab.token_to_piece(id, false)) == reference["plain_pieces"][size_t(id)].get<std::string>();
    if (!same && ++n_piece_mismatches <= 5) {
      CHECK_MESSAGE(same, model_path, " token ", id, " '", vocab.token_text(id), "' renders differently");
    }
  }
  CHECK(n_piece_mismatches == 0);

  std::vector<Token> eog, control;
  for (Token id = 0; id < vocab.n_tokens(); ++id) {
    if (vocab.is_eog(id)) eog.push_back(id);
    if (vocab.is_control(id)) control.push_back(id);
  }
  CHECK_MESSAGE(eog == reference["eog"].get<std::vector<Token>>(), model_path, " EOG set");
  CHECK_MESSAGE(control == reference["control"].get<std::vector<Token>>(), model_path, " control set");
  CHECK(vocab.bos() == reference["bos"].get<Token>());
  CHECK(vocab.eos() == reference["eos"].get<Token>());
  MESSAGE(model_path, ": ", n_token_cases, " tokenizations and ", with_pieces ? vocab.n_tokens() : 0,
          " pieces agree with llama.cpp");
}

}  // namespace

TEST_CASE("vocab: every ggml-vocab conformance case tokenizes to llama.cpp's expected ids") {
  int n_cases = 0, n_files = 0;
  for (const fs::path& path : conformance_vocabs()) {
    const Vocab vocab = Vocab::from_gguf(File::open(path.string()));
    const std::vector<ConformanceCase> cases = read_cases(path);
    CHECK(!cases.empty());
    for (const ConformanceCase& c : cases) {
      // test-tokenizer-0 tokenizes with add_special = false, parse_special = false.
      const std::vector<Token> ours = vocab.tokenize(c.text, false, false);
      CHECK_MESSAGE(ours == c.expected, path.filename().string(), " input ", json(c.text).dump(),
                    "\n ours:     ", ids_to_string(ours), "\n expected: ", ids_to_string(c.expected));
      ++n_cases;
    }
    ++n_files;
  }
  MESSAGE(n_cases, " conformance cases in ", n_files, " vocab files");
  CHECK(n_files >= 5);
}

TEST_CASE(
    "vocab: detokenize(tokenize(s)) == s for conformance, tricky and random inputs, with and without BOS") {
  std::vector<fs::path> models = conformance_vocabs();
  models.push_back(choreo::testing::shared_dir() / "models" / "stories260K.gguf");
  models.push_back(choreo::testing::default_model());
  const std::vector<ConformanceCase> cases = read_cases(conformance_vocabs().front());
  int n_round_trips = 0;
  for (const fs::path& path : models) {
    const Vocab vocab = Vocab::from_gguf(File::open(choreo::testing::require_file(path)));
    std::vector<std::string> texts;
    for (const auto& c : cases) texts.push_back(c.text);
    texts.insert(texts.end(), kTrickyStrings.begin(), kTrickyStrings.end());
    for (const std::string& text : random_strings(7, 100)) texts.push_back(text);
    for (const std::string& text : texts) {
      // SentencePiece writes spaces as U+2581, so a U+2581 in the input can only come back as a space.
      const std::string expected = vocab.kind() == Vocab::Kind::SPM ? replace_all(text, "\u2581", " ") : text;
      for (const bool add_special : {false, true}) {
        const std::string back = vocab.detokenize(vocab.tokenize(text, add_special));
        CHECK_MESSAGE(back == expected, path.filename().string(), " add_special=", add_special, " ",
                      json(text).dump(), " came back as ", json(back).dump());
        ++n_round_trips;
      }
    }
  }
  MESSAGE(n_round_trips, " round trips");
}

TEST_CASE("vocab: stories260K tokenizes 'Once upon a time' with BOS as llama.cpp and llama2.c do") {
  const Vocab vocab = Vocab::from_gguf(File::open(choreo::testing::shared_file("models/stories260K.gguf")));
  CHECK(vocab.kind() == Vocab::Kind::SPM);
  CHECK(vocab.n_tokens() == 512);
  CHECK(vocab.add_bos());
  CHECK(vocab.tokenize("Once upon a time", true) == std::vector<Token>{1, 403, 407, 261, 378});
  CHECK(vocab.tokenize("Once upon a time", false) == std::vector<Token>{403, 407, 261, 378});
  CHECK(vocab.is_eog(vocab.eos()));
  CHECK(vocab.eot() == -1);
}

TEST_CASE("vocab: the SPM leading-space rule") {
  // tokenize() prefixes a space (U+2581) to the text and to text after each special token, as llama.cpp
  // does with add_space_prefix; detokenize() removes exactly one leading space from the first piece at the
  // start and after each control/user-defined/unknown token, so the round trip is exact.
  const Vocab vocab =
      Vocab::from_gguf(File::open(choreo::testing::shared_file("models/vocab/ggml-vocab-llama-spm.gguf")));
  const std::vector<Token> hello = vocab.tokenize("Hello", false);
  REQUIRE(!hello.empty());
  CHECK(vocab.token_text(hello.front()) == "\xE2\x96\x81Hello");  // the prefix space is part of the token
  CHECK(vocab.token_to_piece(hello.front()) == " Hello");         // and of its piece
  CHECK(vocab.detokenize(hello) == "Hello");                      // but not of the detokenized text
  CHECK(vocab.detokenize(vocab.tokenize(" Hello", false)) == " Hello");
  CHECK(vocab.detokenize(vocab.tokenize("  Hello", true)) == "  Hello");
  // Only one space is removed, and only from the first piece.
  const std::vector<Token> two = vocab.tokenize("Hello world", false);
  CHECK(vocab.detokenize(two) == "Hello world");
  CHECK(vocab.detokenize(std::vector<Token>{two.back(), two.back()}) == "world world");
  // After a special token the tokenizer adds a space again, and the detokenizer removes it again.
  const std::vector<Token> with_special = vocab.tokenize("<s>Hi</s> there", false, true);
  CHECK(with_special.front() == vocab.bos());
  CHECK(vocab.token_text(with_special[1]).rfind("\xE2\x96\x81", 0) == 0);
  CHECK(vocab.detokenize(with_special, true) == "<s>Hi</s> there");
  CHECK(vocab.detokenize(with_special, false) == "Hi there");
  // Empty text: nothing, or only BOS.
  CHECK(vocab.tokenize("", false).empty());
  CHECK(vocab.tokenize("", true) == std::vector<Token>{vocab.bos()});
}

TEST_CASE("vocab: byte-level BPE pieces are raw bytes and multi-token characters round-trip") {
  const Vocab vocab =
      Vocab::from_gguf(File::open(choreo::testing::shared_file("models/vocab/ggml-vocab-gpt-2.gguf")));
  CHECK(vocab.kind() == Vocab::Kind::BPE);
  CHECK_FALSE(vocab.add_bos());
  const std::vector<Token> ids = vocab.tokenize(" 🦙", false);
  CHECK(ids.size() > 1);  // the emoji is split across byte tokens
  std::string joined;
  for (const Token id : ids) joined += vocab.token_to_piece(id);
  CHECK(joined == " 🦙");
  CHECK(vocab.token_to_piece(vocab.find("\xC4\xA0")) == " ");  // "Ġ" is the space byte
  // Bytes that are not UTF-8 are pre-tokenized like U+FFFD (as llama.cpp reads them) but keep their value.
  const std::string invalid = "ab\xFF\xFE cd\xC3";
  CHECK(vocab.detokenize(vocab.tokenize(invalid, false)) == invalid);
}

// ---- brute-force re-computations on synthetic vocabularies ------------------------------------------

namespace {

/// An SPM vocabulary over "abc▁" with random scores, plus byte tokens.
struct SyntheticSpm {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<uint8_t> bytes;

  explicit SyntheticSpm(uint32_t seed) {
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(fmt::format("<0x{:02X}>", b));
      scores.push_back(0);
      types.push_back(6);
    }
    std::mt19937 rng(seed);
    std::set<std::string> seen;
    const std::vector<std::string> alphabet = {"a", "b", "c", "\xE2\x96\x81"};
    for (const auto& s : alphabet) add(s, -100, seen);
    std::uniform_int_distribution<int> letter(0, 3), length(2, 5);
    std::uniform_real_distribution<float> score(-20, -1);
    while (tokens.size() < 259 + 4 + 60) {
      std::string piece;
      for (int n = length(rng); n > 0; --n) piece += alphabet[size_t(letter(rng))];
      // a few exact ties make the leftmost rule matter
      add(piece, tokens.size() % 7 == 0 ? -5.0f : std::round(score(rng) * 4) / 4, seen);
    }
    Writer writer;
    writer.set_string("tokenizer.ggml.model", "llama");
    writer.set_string_array("tokenizer.ggml.tokens", tokens);
    writer.set_f32_array("tokenizer.ggml.scores", scores);
    writer.set_i32_array("tokenizer.ggml.token_type", types);
    bytes = writer.to_bytes();
  }
  void add(const std::string& text, float score, std::set<std::string>& seen) {
    if (!seen.insert(text).second) return;
    tokens.push_back(text);
    scores.push_back(score);
    types.push_back(1);
  }

  /// Textbook SentencePiece BPE: repeatedly merge the adjacent pair whose joined text is the best-scoring
  /// token (leftmost on ties), then map symbols to ids.
  std::vector<Token> naive(const std::string& text) const {
    std::map<std::string, std::pair<Token, float>> lookup;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] == 1) lookup[tokens[i]] = {Token(i), scores[i]};
    }
    std::string escaped = "\xE2\x96\x81";
    for (const char c : text) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    std::vector<std::string> symbols;
    for (size_t i = 0; i < escaped.size();) {
      const size_t n = (uint8_t(escaped[i]) >= 0xE0) ? 3 : 1;
      symbols.push_back(escaped.substr(i, n));
      i += n;
    }
    for (;;) {
      int best = -1;
      float best_score = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = lookup.find(symbols[i] + symbols[i + 1]);
        if (it != lookup.end() && (best < 0 || it->second.second > best_score)) {
          best = int(i);
          best_score = it->second.second;
        }
      }
      if (best < 0) break;
      symbols[size_t(best)] += symbols[size_t(best) + 1];
      symbols.erase(symbols.begin() + best + 1);
    }
    std::vector<Token> ids;
    for (const auto& s : symbols) ids.push_back(lookup.at(s).first);
    return ids;
  }
};

}  // namespace

TEST_CASE("vocab: SPM merges equal a brute-force best-score-first recomputation") {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const SyntheticSpm synthetic(seed);
    const Vocab vocab = Vocab::from_gguf(File::parse(synthetic.bytes, "synthetic-spm.gguf"));
    std::mt19937 rng(seed * 7919);
    std::uniform_int_distribution<int> letter(0, 3), length(1, 40);
    for (int trial = 0; trial < 200; ++trial) {
      std::string text;
      for (int n = length(rng); n > 0; --n) text += "abc "[letter(rng)];
      CHECK_MESSAGE(vocab.tokenize(text, false) == synthetic.naive(text), "seed ", seed, " text '", text,
                    "'");
      CHECK(vocab.detokenize(vocab.tokenize(text, true)) == text);
    }
  }
}

TEST_CASE("vocab: SPM byte fallback spells unknown characters as <0xXX> tokens") {
  const SyntheticSpm synthetic(1);
  const Vocab vocab = Vocab::from_gguf(File::parse(synthetic.bytes, "synthetic-spm.gguf"));
  const std::vector<Token> ids = vocab.tokenize("é", false);  // not in the vocabulary: C3 A9
  REQUIRE(ids.size() == 3);
  CHECK(vocab.token_text(ids[1]) == "<0xC3>");
  CHECK(vocab.token_text(ids[2]) == "<0xA9>");
  CHECK(vocab.detokenize(ids) == "é");
}

namespace {

/// A byte-level BPE vocabulary whose merges build random strings over "abc" (no spaces, so the GPT-2
/// pre-tokenizer leaves each test word whole).
struct SyntheticBpe {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<uint8_t> bytes;

  explicit SyntheticBpe(uint32_t seed) {
    tokens = {"a", "b", "c", "<|endoftext|>"};
    std::set<std::string> known(tokens.begin(), tokens.begin() + 3);
    std::vector<std::string> pool(tokens.begin(), tokens.begin() + 3);
    std::mt19937 rng(seed);
    while (merges.size() < 40) {
      const std::string& left = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      const std::string& right = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      const std::string joined = left + right;
      if (joined.size() > 6 || known.count(joined)) continue;
      merges.emplace_back(left, right);
      known.insert(joined);
      tokens.push_back(joined);
      pool.push_back(joined);
    }
    std::vector<std::string> merge_lines;
    for (const auto& [l, r] : merges) merge_lines.push_back(l + " " + r);
    std::vector<int32_t> types(tokens.size(), 1);
    types[3] = 3;
    Writer writer;
    writer.set_string("tokenizer.ggml.model", "gpt2");
    writer.set_string("tokenizer.ggml.pre", "gpt-2");
    writer.set_string_array("tokenizer.ggml.tokens", tokens);
    writer.set_i32_array("tokenizer.ggml.token_type", types);
    writer.set_string_array("tokenizer.ggml.merges", merge_lines);
    writer.set_u32("tokenizer.ggml.eos_token_id", 3);
    writer.set_u32("tokenizer.ggml.bos_token_id", 3);
    bytes = writer.to_bytes();
  }

  /// Textbook BPE: repeatedly apply the lowest-ranked merge present (leftmost occurrence first).
  std::vector<Token> naive(const std::string& word) const {
    std::vector<std::string> symbols;
    for (const char c : word) symbols.emplace_back(1, c);
    for (;;) {
      size_t best_rank = merges.size(), best_at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        for (size_t rank = 0; rank < best_rank; ++rank) {
          if (merges[rank].first == symbols[i] && merges[rank].second == symbols[i + 1]) {
            best_rank = rank;
            best_at = i;
            break;
          }
        }
      }
      if (best_rank == merges.size()) break;
      symbols[best_at] += symbols[best_at + 1];
      symbols.erase(symbols.begin() + long(best_at) + 1);
    }
    std::vector<Token> ids;
    for (const auto& s : symbols) {
      ids.push_back(Token(std::find(tokens.begin(), tokens.end(), s) - tokens.begin()));
    }
    return ids;
  }
};

}  // namespace

TEST_CASE("vocab: BPE merges equal a brute-force lowest-rank-first recomputation") {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const SyntheticBpe synthetic(seed);
    const Vocab vocab = Vocab::from_gguf(File::parse(synthetic.bytes, "synthetic-bpe.gguf"));
    std::mt19937 rng(seed * 104729);
    std::uniform_int_distribution<int> letter(0, 2), length(1, 30);
    for (int trial = 0; trial < 200; ++trial) {
      std::string word;
      for (int n = length(rng); n > 0; --n) word += "abc"[letter(rng)];
      CHECK_MESSAGE(vocab.tokenize(word, false) == synthetic.naive(word), "seed ", seed, " word '", word,
                    "'");
    }
  }
}

TEST_CASE("vocab: special tokens split only with parse_special, longest first") {
  const Vocab vocab =
      Vocab::from_gguf(File::open(choreo::testing::require_file(choreo::testing::default_model())));
  const Token im_start = vocab.find("<|im_start|>");
  const Token im_end = vocab.find("<|im_end|>");
  REQUIRE(im_start >= 0);
  REQUIRE(im_end >= 0);
  const std::vector<Token> parsed = vocab.tokenize("<|im_start|>user\nhi<|im_end|>", false, true);
  CHECK(parsed.front() == im_start);
  CHECK(parsed.back() == im_end);
  const std::vector<Token> literal = vocab.tokenize("<|im_start|>user\nhi<|im_end|>", false, false);
  CHECK(std::find(literal.begin(), literal.end(), im_start) == literal.end());
  CHECK(vocab.detokenize(literal) == "<|im_start|>user\nhi<|im_end|>");
  CHECK(vocab.detokenize(parsed, false) == "user\nhi");
  CHECK(vocab.detokenize(parsed, true) == "<|im_start|>user\nhi<|im_end|>");
  // End of turn and end of generation: SmolLM2 names EOS (<|im_end|>) but no EOT; the EOT found by text is
  // the first of llama.cpp's list present (<|im_end|> before <|endoftext|>).
  CHECK(vocab.eot() == im_end);
  CHECK(vocab.is_eog(im_end));
  CHECK(vocab.is_eog(vocab.find("<|endoftext|>")));
  CHECK_FALSE(vocab.is_eog(im_start));
  CHECK(vocab.is_control(im_start));
  CHECK_FALSE(vocab.is_control(vocab.find("Hello")));
  CHECK_FALSE(vocab.add_bos());
}

TEST_CASE("vocab: SmolLM2 agrees with llama.cpp (llama-cpp-python) on tricky strings, pieces and EOG") {
  check_against_llama_cpp(choreo::testing::require_file(choreo::testing::default_model()));
}

TEST_CASE("vocab: every shared vocab agrees with llama.cpp beyond the conformance files") {
  std::vector<fs::path> models = conformance_vocabs();
  models.push_back(choreo::testing::shared_dir() / "models" / "stories260K.gguf");
  models.push_back(choreo::testing::shared_dir() / "models" / "llama-2-tiny-random.gguf");
  for (const fs::path& path : models) check_against_llama_cpp(choreo::testing::require_file(path));
}

TEST_CASE("vocab: every pre-tokenizer flavor agrees with llama.cpp (gpt-2 vocabulary relabelled)") {
  // Only gpt-2, mpt, refact, smollm and deepseek-coder have real vocab files here; the other regex lists are
  // checked by giving the gpt-2 vocabulary another tokenizer.ggml.pre and letting both sides tokenize it.
  const File original = File::open(choreo::testing::shared_file("models/vocab/ggml-vocab-gpt-2.gguf"));
  for (const std::string pre :
       {"default", "llama-bpe", "qwen2", "starcoder", "deepseek-coder", "falcon", "poro-chat", "tekken",
        "gpt-4o", "seed-coder", "chatglm-bpe", "dbrx", "stablelm2", "command-r"}) {
    Writer writer;
    for (const auto& [key, value] : original.metadata()) writer.set(key, value);
    writer.set_string("tokenizer.ggml.pre", pre);
    const fs::path path = fs::temp_directory_path() / fmt::format("choreo_vocab_{}_{}.gguf", pre, getpid());
    writer.write(path.string());
    check_against_llama_cpp(path.string(), false);
    fs::remove(path);
  }
}

TEST_CASE("vocab: tokenizing 100 KB of English is fast (no quadratic merging)") {
  std::ifstream news(choreo::testing::shared_file("data/longbench/multi_news.jsonl"));
  std::string text;
  for (std::string line; text.size() < 100'000 && std::getline(news, line);) {
    text += json::parse(line)["context"].get<std::string>();
  }
  text.resize(std::min<size_t>(text.size(), 100'000));
  while (!text.empty() && (uint8_t(text.back()) & 0xC0) == 0x80) text.pop_back();  // whole characters
  for (const fs::path& path : {choreo::testing::default_model(),
                               choreo::testing::shared_dir() / "models/vocab/ggml-vocab-llama-spm.gguf"}) {
    const Vocab vocab = Vocab::from_gguf(File::open(choreo::testing::require_file(path)));
    const auto start = std::chrono::steady_clock::now();
    const std::vector<Token> ids = vocab.tokenize(text, false);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    MESSAGE(path.filename().string(), ": ", text.size(), " bytes -> ", ids.size(), " tokens in ", ms, " ms");
    CHECK(vocab.detokenize(ids) == text);
    CHECK(ms < 5000);  // a guard against quadratic behaviour only; speed is measured, not asserted
  }
}

// ---- bad metadata -------------------------------------------------------------------------------------

namespace {

/// A small valid SPM vocabulary; `edit` changes the metadata before it is written.
std::string vocab_error(const std::function<void(Writer&)>& edit, bool write_tokens = true) {
  Writer writer;
  writer.set_string("tokenizer.ggml.model", "llama");
  if (write_tokens)
    writer.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "ab"});
  writer.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -1, -2});
  writer.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1});
  edit(writer);
  const std::vector<uint8_t> bytes = writer.to_bytes();
  try {
    Vocab::from_gguf(File::parse(bytes, "bad-vocab.gguf"));
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.rfind("bad-vocab.gguf: ", 0) == 0, what);
    return what;
  }
  return "no error";
}

void set_bpe(Writer& w, std::vector<std::string> merges) {
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt-2");
  w.set_string_array("tokenizer.ggml.merges", std::move(merges));
}

}  // namespace

TEST_CASE("vocab: inconsistent metadata is an InputError naming the file and the key") {
  const auto contains = [](const std::string& what, std::string_view key) {
    return what.find(key) != std::string::npos;
  };
  CHECK(vocab_error([](Writer&) {}) == "no error");
  CHECK(contains(vocab_error([](Writer&) {}, false), "tokenizer.ggml.tokens"));
  CHECK(contains(vocab_error([](Writer& w) {
                   w.set_f32_array("tokenizer.ggml.scores", {0, 0});
                 }),
                 "tokenizer.ggml.scores"));
  CHECK(contains(vocab_error([](Writer& w) {
                   w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1});
                 }),
                 "tokenizer.ggml.token_type"));
  CHECK(contains(vocab_error([](Writer& w) { w.set_string("tokenizer.ggml.model", "wordpiece"); }),
                 "tokenizer.ggml.model"));
  CHECK(contains(vocab_error([](Writer& w) { w.set_u32("tokenizer.ggml.bos_token_id", 6); }),
                 "tokenizer.ggml.bos_token_id"));
  CHECK(contains(vocab_error([](Writer& w) { w.set_u32("tokenizer.ggml.eos_token_id", 1000); }),
                 "tokenizer.ggml.eos_token_id"));
  CHECK(contains(vocab_error([](Writer& w) {
                   w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "a", "ab"});
                 }),
                 "tokenizer.ggml.tokens"));
  CHECK(vocab_error([](Writer& w) { set_bpe(w, {"a b"}); }) == "no error");
  CHECK(contains(vocab_error([](Writer& w) {
                   w.set_string("tokenizer.ggml.model", "gpt2");
                   w.set_string("tokenizer.ggml.pre", "gpt-2");
                 }),
                 "tokenizer.ggml.merges"));
  CHECK(contains(vocab_error([](Writer& w) { set_bpe(w, {"a b", "ab c"}); }), "tokenizer.ggml.merges[1]"));
  CHECK(contains(vocab_error([](Writer& w) { set_bpe(w, {"ab"}); }), "tokenizer.ggml.merges[0]"));
  CHECK(contains(vocab_error([](Writer& w) {
                   set_bpe(w, {"a b"});
                   w.set_string("tokenizer.ggml.pre", "no-such-pre");
                 }),
                 "tokenizer.ggml.pre"));
  CHECK(contains(vocab_error([](Writer& w) {
                   set_bpe(w, {"a b"});
                   w.set_bool("tokenizer.ggml.add_bos_token",
                              true);  // BPE's default BOS (11) is out of range
                 }),
                 "tokenizer.ggml.add_bos_token"));
  // "not set" written as 0xFFFFFFFF (as converters do) keeps the default rather than failing.
  CHECK(vocab_error([](Writer& w) { w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFF); }) ==
        "no error");
  CHECK(vocab_error([](Writer& w) { w.set_u32("tokenizer.ggml.bos_token_id", 0xFFFFFFFF); }) == "no error");
}

TEST_CASE("vocab: token ids outside the vocabulary are an InputError, not a crash") {
  const Vocab vocab = Vocab::from_gguf(File::open(choreo::testing::shared_file("models/stories260K.gguf")));
  CHECK_THROWS_AS(vocab.token_to_piece(512), InputError);
  CHECK_THROWS_AS(vocab.token_text(-1), InputError);
  CHECK_THROWS_AS(vocab.detokenize(std::vector<Token>{1, 9999}), InputError);
  CHECK_FALSE(vocab.is_eog(-1));
  CHECK_FALSE(vocab.is_control(100000));
}

// min_tokens bounds a text's tokens from below before tokenising it (exec refuses a text that cannot fit
// the context that way: issue 42, finding 8). The bound must hold for every text and vocabulary, or a text
// that fits would be refused.
TEST_CASE("vocab: min_tokens is at most the tokens of any text, and grows with its bytes") {
  std::vector<fs::path> models = conformance_vocabs();
  models.push_back(choreo::testing::shared_dir() / "models" / "stories260K.gguf");
  models.push_back(choreo::testing::default_model());
  std::vector<std::string> texts = kTrickyStrings;
  for (const ConformanceCase& c : read_cases(conformance_vocabs().front())) texts.push_back(c.text);
  for (const std::string& text : random_strings(11, 200)) texts.push_back(text);
  std::string every_byte;
  for (int byte = 0; byte < 256; ++byte) every_byte += char(byte);  // invalid UTF-8 too
  texts.push_back(every_byte);
  int n_checked = 0;
  for (const fs::path& path : models) {
    const Vocab vocab = Vocab::from_gguf(File::open(choreo::testing::require_file(path)));
    const size_t longest = vocab.longest_token_bytes();
    std::vector<std::string> own = texts;
    for (Token id = 0; id < vocab.n_tokens(); ++id)  // the longest spellings, over and over
      if (vocab.token_text(id).size() == longest) own.push_back(std::string(vocab.token_text(id)) + "x");
    for (const std::string& text : own)
      for (const bool parse_special : {false, true}) {
        CHECK_MESSAGE(vocab.min_tokens(text) <= vocab.tokenize(text, false, parse_special).size(),
                      path.filename().string(), " parse_special=", parse_special, " ", json(text).dump());
        ++n_checked;
      }
    // Not vacuous: plain letters are counted at the longest spelling's rate.
    CHECK(vocab.min_tokens(std::string(longest * 100, 'a')) == 100);
  }
  MESSAGE(n_checked, " texts checked");
}

TEST_CASE("vocab: min_tokens leaves out bytes a BPE vocabulary can drop") {
  // "é" is C3 A9, spelled "Ã©" by byte-level BPE. Each byte has a token and a merge joins them, but not into
  // a token: the joined run falls back to its bytes one by one, and only ASCII spellings are found alone, so
  // "é" makes no token at all.
  Writer writer;
  set_bpe(writer, {"Ã ©"});
  writer.set_string_array("tokenizer.ggml.tokens", {"a", "b", "Ã", "©"});
  writer.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1});
  const std::vector<uint8_t> bytes = writer.to_bytes();
  const Vocab vocab = Vocab::from_gguf(File::parse(bytes, "dropping.gguf"));
  const std::string text = "é é é ab";
  CHECK(vocab.tokenize(text, false).size() == 2);  // "a", "b"
  CHECK(vocab.min_tokens(text) <= 2);
  CHECK(vocab.min_tokens("ab") == 1);
}
