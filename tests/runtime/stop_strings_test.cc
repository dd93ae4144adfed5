// Stop strings (runtime/engine/stop_strings.h): the incremental scanner the engine uses decides, after every
// token, exactly what the whole-text rule it replaced decided (re-detokenise the whole continuation, look for
// every stop string in it), on real vocabularies, byte-fallback tokens and stop strings that straddle tokens.

#include "runtime/engine/stop_strings.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using runtime::StopScanner;

/// The rule the engine applied before the scanner, as it was: the text so far contains a non-empty stop
/// string.
bool whole_text_rule(const std::string& text, const std::vector<std::string>& stops) {
  bool finished = false;
  for (const std::string& s : stops)
    if (!s.empty() && text.find(s) != std::string::npos) finished = true;
  return finished;
}

/// The tokens whose piece is one byte, by byte (-1 where the vocabulary has none): byte-fallback tokens
/// <0xAB> of SentencePiece vocabularies, the 256 byte tokens of byte-level BPE.
std::vector<model::Token> byte_tokens(const model::Vocab& vocab) {
  std::vector<model::Token> of_byte(256, -1);
  for (model::Token t = 0; t < vocab.n_tokens(); ++t) {
    const std::string piece = vocab.token_to_piece(t);
    if (piece.size() == 1 && of_byte[uint8_t(piece[0])] < 0) of_byte[uint8_t(piece[0])] = t;
  }
  return of_byte;
}

/// What the comparison saw, so that a test can show it was not vacuous.
struct Coverage {
  int sequences = 0;
  int stopped = 0;          // sequences where some token completed a stop string
  int straddling = 0;       // ... whose first occurrence began in an earlier token than the completing one
  int multibyte_split = 0;  // ... where that occurrence held a non-ASCII byte and straddled
};

/// Random token sequences over `vocab` (random ids, byte tokens, UTF-8 characters spelled byte by byte) with
/// random stop strings (pieces of the sequence's own text across token boundaries, characters, incomplete
/// UTF-8, empty strings, strings that never occur). After every token, the scanner must agree with the
/// whole-text rule.
Coverage compare_on_random_sequences(const model::Vocab& vocab, uint32_t seed, int n_sequences) {
  std::mt19937 rng(seed);
  auto below = [&](int n) { return int(rng() % uint32_t(n)); };
  const std::vector<model::Token> of_byte = byte_tokens(vocab);
  std::vector<model::Token> high_bytes;  // tokens of bytes >= 0x80: pieces of UTF-8 characters
  for (int b = 0x80; b < 256; ++b)
    if (of_byte[b] >= 0) high_bytes.push_back(of_byte[b]);
  REQUIRE(high_bytes.size() >= 64);  // both vocabularies have byte tokens: the test covers them
  const std::vector<std::string> characters = {"é", "中", "😀", "ß", "\xe2\x80\x94"};
  Coverage seen;
  for (int n = 0; n < n_sequences; ++n) {
    std::vector<model::Token> tokens;
    const int length = 1 + below(48);
    while (int(tokens.size()) < length) {
      switch (below(4)) {
        case 0:
          tokens.push_back(high_bytes[below(int(high_bytes.size()))]);
          break;
        case 1:  // a whole character, one byte token per byte, where the vocabulary has them all
          for (unsigned char c : characters[below(int(characters.size()))])
            if (of_byte[c] >= 0) tokens.push_back(of_byte[c]);
          break;
        default:
          tokens.push_back(model::Token(below(vocab.n_tokens())));
      }
    }
    std::vector<std::string> pieces;
    std::string text;
    for (model::Token t : tokens) text += pieces.emplace_back(vocab.token_to_piece(t));
    std::vector<std::string> stops;
    for (int k = 1 + below(3); k > 0; --k) {
      switch (below(6)) {
        case 0:
          stops.push_back(characters[below(int(characters.size()))]);
          break;
        case 1:
          stops.push_back("\xe4\xb8");
          break;  // the first two bytes of 中: an incomplete character
        case 2:
          stops.push_back("");
          break;
        case 3:
          stops.push_back("\x01never\x02");
          break;
        default:  // a piece of this sequence's own text, often across token boundaries
          if (!text.empty()) {
            const size_t at = size_t(below(int(text.size())));
            stops.push_back(text.substr(at, 1 + size_t(below(12))));
          }
      }
    }
    std::string described;  // for a failure: the sequence and its stop strings
    for (model::Token t : tokens) described += std::to_string(t) + " ";
    for (const std::string& stop : stops) described += "| stop of " + std::to_string(stop.size()) + " bytes ";
    CAPTURE(n);
    CAPTURE(described);
    StopScanner scanner(stops);
    std::string so_far;
    int completed_at = -1;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const size_t before = so_far.size();
      so_far += pieces[i];
      const bool expected = whole_text_rule(so_far, stops);
      REQUIRE(scanner.append(pieces[i]) == expected);
      if (expected && completed_at < 0) {
        completed_at = int(i);
        bool straddles = false, non_ascii = false;
        for (const std::string& stop : stops) {
          if (stop.empty() || so_far.find(stop) >= before) continue;  // absent, or all in this token's bytes
          straddles = true;
          non_ascii |= std::any_of(stop.begin(), stop.end(), [](char c) { return uint8_t(c) >= 0x80; });
        }
        seen.straddling += straddles;
        seen.multibyte_split += non_ascii;
      }
    }
    ++seen.sequences;
    if (completed_at >= 0) ++seen.stopped;
  }
  return seen;
}

TEST_CASE(
    "incremental stop detection decides as the whole-text rule after every token (stories260K vocabulary)") {
  const Coverage seen = compare_on_random_sequences(testing::stories260k().model->vocab(), 1, 3000);
  MESSAGE("stories260K: ", seen.stopped, " of ", seen.sequences, " sequences stopped, ", seen.straddling,
          " across a token boundary, ", seen.multibyte_split, " of them inside non-ASCII bytes");
  CHECK(seen.stopped > seen.sequences / 3);  // not vacuous: many sequences stop, and in the ways that matter
  CHECK(seen.straddling > 100);
  CHECK(seen.multibyte_split > 20);
}

TEST_CASE(
    "incremental stop detection decides as the whole-text rule after every token (SmolLM2 vocabulary)") {
  const Coverage seen = compare_on_random_sequences(testing::smollm2().model->vocab(), 2, 3000);
  MESSAGE("SmolLM2: ", seen.stopped, " of ", seen.sequences, " sequences stopped, ", seen.straddling,
          " across a token boundary, ", seen.multibyte_split, " of them inside non-ASCII bytes");
  CHECK(seen.stopped > seen.sequences / 3);
  CHECK(seen.straddling > 100);
  CHECK(seen.multibyte_split > 20);
}

TEST_CASE(
    "stop scanner: strings split across tokens, incomplete characters, empty and repeated stop strings") {
  SUBCASE("a stop string completed by a later token, with text before it") {
    StopScanner s(std::vector<std::string>{"cat!"});
    CHECK_FALSE(s.append("the c"));
    CHECK_FALSE(s.append("a"));
    CHECK(s.append("t!!"));
    CHECK(s.append("more"));  // stays found, as the whole text still contains it
  }
  SUBCASE("a character whose bytes come one token each") {
    StopScanner s(std::vector<std::string>{"中"});
    CHECK_FALSE(s.append("\xe4"));
    CHECK_FALSE(s.append("\xb8"));
    CHECK(s.append("\xad"));
  }
  SUBCASE("a stop string longer than any one token, behind a long token") {
    StopScanner s(std::vector<std::string>{"abcdef"});
    CHECK_FALSE(s.append(std::string(1000, 'x') + "ab"));
    CHECK_FALSE(s.append("cd"));
    CHECK(s.append("efx"));
  }
  SUBCASE("empty stop strings never match; no stop strings never match") {
    StopScanner empty(std::vector<std::string>{"", ""});
    CHECK_FALSE(empty.append("anything"));
    StopScanner none(std::vector<std::string>{});
    CHECK_FALSE(none.append("anything"));
  }
  SUBCASE("find_stop gives the earliest occurrence over all stop strings") {
    const std::vector<std::string> stops = {"", "z", "bc", "ab"};
    CHECK(runtime::find_stop("xxabcz", stops) == 2);
    CHECK(runtime::find_stop("xxyy", stops) == std::string::npos);
  }
}

TEST_CASE("a decode stops at the token that completes a stop string, and its text ends before the string") {
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine e(m, pool);
  const auto story = e.prefill({m.vocab().tokenize("Once upon a time, there was a little dog.", false)}).id;
  runtime::DecodeRequest d;
  d.header = m.vocab().tokenize(" The dog", false);
  d.parents = {{story, {}, {}}};
  d.sampling.temperature = 0;
  d.exact_tokens = 40;
  const runtime::DecodeResult free_run = e.decode(d);
  // A stop string from the middle of that text, across a token boundary: from the last byte of token 9's
  // piece to the first two of token 11's (greedy decoding repeats the same tokens up to it).
  std::vector<std::string> pieces;
  for (model::Token t : free_run.generated) pieces.push_back(m.vocab().token_to_piece(t));
  REQUIRE(pieces[9].size() >= 1);
  REQUIRE(pieces[11].size() >= 2);
  const std::string stop = pieces[9].substr(pieces[9].size() - 1) + pieces[10] + pieces[11].substr(0, 2);
  d.exact_tokens.reset();
  d.max_tokens = 40;
  d.stop = {stop, ""};
  const runtime::DecodeResult stopped = e.decode(d);
  CHECK(stopped.stop_reason == "stop");
  std::string whole;
  for (const std::string& p : pieces) whole += p;
  const size_t first = whole.find(stop);
  REQUIRE(first != std::string::npos);
  // The first token whose piece completes the earliest occurrence ends the decode.
  size_t end = 0, n_tokens = 0;
  while (end < first + stop.size()) end += pieces[n_tokens++].size();
  CHECK(stopped.generated ==
        std::vector<model::Token>(free_run.generated.begin(), free_run.generated.begin() + long(n_tokens)));
  CHECK(stopped.text == whole.substr(0, first));
}

}  // namespace
}  // namespace choreo
