#include "runtime/model/pretokenizer.h"

#include <fmt/format.h>

#include <array>
#include <stdexcept>
#include <utility>

#include "common/error.h"
#include "common/regex.h"
#include "runtime/model/unicode.h"

namespace choreo::model {

namespace {

// The regexes below are the ones the model families' tokenizer.json files declare, in the (ASCII-only)
// case-insensitive spelling llama.cpp uses: PCRE2's (?i) would also fold 'ſ' to 's' and 'K' (Kelvin) to 'k'.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kSeedCoder =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// tokenizer.json has "[一-龥ࠀ-一가-퟿]+". llama.cpp matches regexes without \p{..} on a copy of the text
// in which non-ASCII whitespace is U+000B, so e.g. U+2003 is not part of the (wide) range U+0800..U+4E00.
constexpr std::string_view kDeepseekCjk = R"((?:(?!\s)[一-龥ࠀ-一가-퟿])+)";
constexpr std::string_view kPoro = R"( ?[^(\s|.,!?…。，、।۔،)]+)";

// llama.cpp runs kGpt2 and kLlama3 through hand-written scanners (unicode.cpp) rather than a regex engine;
// PCRE2 with these regexes splits the same way (checked against llama.cpp by tests/model/vocab_test.cc).

struct NamedFlavor {
  std::vector<std::string_view> names;
  BpeFlavor flavor;
};

std::vector<std::string> list(std::initializer_list<std::string_view> items) {
  return {items.begin(), items.end()};
}

// Mirrors llama.cpp's llama_vocab::impl::load (name -> pre type, flags) and llm_tokenizer_bpe (pre type ->
// regexes) for the families choreo supports.
const std::vector<NamedFlavor>& flavors() {
  static const std::vector<NamedFlavor> table = {
      {{"", "default"},
       {list({R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}), false, false, true}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {list({kLlama3}), true, true, true}},
      {{"dbrx", "smaug-bpe"}, {list({kLlama3}), false, false, true}},
      {{"deepseek-coder"},
       {list({"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}), false, false, true}},
      {{"falcon"}, {list({R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}), false, false, true}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "exaone4", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
        "trillion"},
       {list({kGpt2}), false, false, true}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {list({R"(\p{N})", kGpt2}), false, false, true}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2"}, {list({kQwen2}), false, false, true}},
      {{"glm4", "chatglm-bpe"}, {list({kLlama3}), false, false, false}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {list({kPoro}), false, false, true}},
      {{"tekken"}, {list({kTekken}), true, true, true}},
      {{"gpt-4o", "llama4"}, {list({kGpt4o}), false, false, true}},
      {{"seed-coder"}, {list({kSeedCoder}), false, false, true}},
  };
  return table;
}

}  // namespace

const BpeFlavor* find_bpe_flavor(std::string_view pre_name) {
  for (const auto& entry : flavors()) {
    for (std::string_view name : entry.names) {
      if (name == pre_name) return &entry.flavor;
    }
  }
  return nullptr;
}

std::string known_bpe_flavor_names() {
  std::string out;
  for (const auto& entry : flavors()) {
    for (std::string_view name : entry.names) {
      if (name.empty()) continue;
      if (!out.empty()) out += ", ";
      out += name;
    }
  }
  return out;
}

struct PreTokenizer::Pattern {
  explicit Pattern(const std::string& source)
      : regex(source, Regex::Options{.invalid_utf_never_matches = false, .dollar_end_only = true, .jit = true}) {}
  Regex regex;
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& regexes) {
  for (const std::string& source : regexes) {
    auto pattern = std::make_unique<Pattern>(source);
    if (!pattern->regex.ok())
      throw std::invalid_argument(fmt::format("pre-tokenizer regex '{}' does not compile at {}: {}", source,
                                              pattern->regex.compile_error_offset(),
                                              pattern->regex.compile_error()));
    patterns_.push_back(std::move(pattern));
  }
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

namespace {

constexpr std::string_view kMongolianVowelSeparator = "\xE1\xA0\x8E";  // U+180E
constexpr std::string_view kZeroWidthSpace = "\xE2\x80\x8B";           // U+200B

/// The text PCRE2 matches on: strict UTF-8, with a map back to the caller's byte offsets.
struct Subject {
  std::string_view text;
  std::string replaced;          // used only when the input is not strict UTF-8 or holds U+180E
  std::vector<size_t> original;  // original[offset in text] at code point boundaries; empty = identity

  explicit Subject(std::string_view input) : text(input) {
    if (is_strict_utf8(input)) {
      // U+180E (Mongolian vowel separator) is \s to PCRE2 but not whitespace to llama.cpp; U+200B is a
      // format character both agree on and has the same UTF-8 length, so offsets stay put.
      if (input.find(kMongolianVowelSeparator) == std::string_view::npos) return;
      replaced = input;
      for (size_t at; (at = replaced.find(kMongolianVowelSeparator)) != std::string::npos;) {
        replaced.replace(at, kZeroWidthSpace.size(), kZeroWidthSpace);
      }
      text = replaced;
      return;
    }
    original.assign(1, 0);
    for (size_t offset = 0; offset < input.size();) {
      const Utf8Char c = decode_utf8(input, offset);
      // What llama.cpp decodes leniently (overlongs, surrogates) PCRE2 rejects; both see U+FFFD here.
      const bool strict = c.valid && is_strict_utf8(input.substr(offset, c.n_bytes));
      append_utf8(replaced, !strict ? 0xFFFD : c.codepoint == 0x180E ? 0x200B : c.codepoint);
      offset += c.n_bytes;
      original.resize(replaced.size() + 1, offset);
      original[replaced.size()] = offset;
    }
    text = replaced;
  }
  size_t to_original(size_t offset) const { return original.empty() ? offset : original[offset]; }
};

size_t next_codepoint(std::string_view text, size_t offset) {
  return std::min(text.size(), offset + utf8_sequence_length(static_cast<uint8_t>(text[offset])));
}

}  // namespace

std::vector<std::string_view> PreTokenizer::split(std::string_view input) const {
  const Subject subject(input);
  const std::string_view text = subject.text;
  std::vector<std::pair<size_t, size_t>> pieces;  // [begin, end) in `text`
  if (!text.empty()) pieces.emplace_back(0, text.size());
  std::vector<std::pair<size_t, size_t>> next;
  for (const auto& pattern : patterns_) {
    Regex::Match match(pattern->regex);
    next.clear();
    const auto add_gap = [&](size_t begin, size_t end) {  // text no match covers is a piece of its own
      if (begin < end) next.emplace_back(begin, end);
    };
    for (const auto& [begin, end] : pieces) {
      // Each piece is its own subject, so look-arounds cannot see past its edges (as in llama.cpp).
      const std::string_view piece = text.substr(begin, end - begin);
      size_t done = begin;    // everything before this is emitted
      size_t search = begin;  // where the next match attempt starts
      while (search < end) {
        const Regex::Outcome outcome = pattern->regex.search(piece, search - begin, match, /*utf_checked=*/true);
        if (outcome == Regex::Outcome::NoMatch) break;
        if (outcome != Regex::Outcome::Match)
          throw RuntimeFailure(fmt::format("pre-tokenizer regex failed with PCRE2 error {}", match.error()));
        const auto [piece_begin, piece_end] = *match.group(0);
        const size_t match_begin = begin + piece_begin;
        const size_t match_end = begin + piece_end;
        if (match_end == match_begin) {  // an empty match splits nothing; look further on
          search = next_codepoint(text, match_begin);
          continue;
        }
        add_gap(done, match_begin);
        next.emplace_back(match_begin, match_end);
        done = search = match_end;
      }
      add_gap(done, end);
    }
    pieces.swap(next);
  }

  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (const auto& [begin, end] : pieces) {
    const size_t original_begin = subject.to_original(begin);
    words.push_back(input.substr(original_begin, subject.to_original(end) - original_begin));
  }
  return words;
}

}  // namespace choreo::model
