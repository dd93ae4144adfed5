// The pieces of `choreo serve`'s plain path that the client tests (serve_test.cc) see only through HTTP: a
// session built from a copied prefix holds what evaluating the tokens itself gives, bit for bit; the session
// cache picks the longest cached prefix, extends a session in place only when that keeps its tokens, and copies
// otherwise; the text stream never shows a stop string or half a UTF-8 character, and what it shows adds up to
// the final text.

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/model_set.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "runtime/serve/session_cache.h"
#include "runtime/serve/text_stream.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

std::vector<model::Token> tokens_of(const model::Model& m, const std::string& text) {
  return m.vocab().tokenize(text, true, true);
}

TEST_CASE("serve sessions: a copied prefix and the rest evaluated give the bits of the whole prompt evaluated once") {
  const model::Model& m = *testing::smollm2().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  const std::vector<model::Token> prompt =
      tokens_of(m, "<|im_start|>user\nName the planets of the solar system in order, please.<|im_end|>\n"
                   "<|im_start|>assistant\n");
  REQUIRE(prompt.size() > 20);
  model::Session whole(m, pool);
  std::vector<float> whole_logits;
  whole.eval(prompt, &whole_logits);
  for (int cut : {1, 15, 16, 17, int(prompt.size()) - 1}) {
    CAPTURE(cut);
    model::Session source(m, pool), copy(m, pool);
    std::vector<float> ignored, logits;
    // The source holds the prefix and something else after it, as a cached session of another agent would.
    std::vector<model::Token> other(prompt.begin(), prompt.begin() + cut);
    other.insert(other.end(), {m.vocab().tokenize(" unrelated tail", false)[0]});
    source.eval(other, &ignored);
    copy.copy_prefix_from(source, cut);
    CHECK(copy.n_past() == cut);
    copy.eval(std::span(prompt).subspan(size_t(cut)), &logits);
    REQUIRE(logits.size() == whole_logits.size());
    CHECK(std::memcmp(logits.data(), whole_logits.data(), logits.size() * sizeof(float)) == 0);
    // Then one decode step, alone and together with another session: the same bits as the whole run's.
    const model::Token next = model::argmax(whole_logits);
    std::vector<float> alone, together;
    model::Session twin(m, pool);
    twin.copy_prefix_from(copy, copy.n_past());
    whole.eval(std::span(&next, 1), &alone);
    std::vector<model::Session*> both{&copy, &source};
    model::Session::decode_together(both, std::vector<model::Token>{next, next}, &together);
    CHECK(std::memcmp(together.data(), alone.data(), alone.size() * sizeof(float)) == 0);
    whole.truncate(int(prompt.size()));
  }
}

TEST_CASE("serve sessions: the cache takes the longest prefix, extends a session only when it keeps its tokens") {
  const model::Model& m = *testing::smollm2().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  runtime::ModelSet models(m);
  serve::SessionCache cache(models, pool);
  const std::vector<model::Token> a = tokens_of(m, "The quick brown fox jumps over the lazy dog near the river bank");
  std::vector<float> logits;
  int reused = -1;
  size_t s1 = cache.acquire(0, a, &reused);
  CHECK(reused == 0);
  cache.session(s1).eval(a, &logits);
  cache.release(s1);

  std::vector<model::Token> longer = a;
  longer.insert(longer.end(), a.begin() + 1, a.begin() + 5);
  size_t s2 = cache.acquire(0, longer, &reused);
  CHECK(reused == int(a.size()));  // every token of the session: extended in place
  CHECK(s2 == s1);
  CHECK(cache.stats().extended == 1);
  cache.session(s2).eval(std::span(longer).subspan(a.size()), &logits);
  cache.release(s2);

  // A prompt that shares only the first 6 tokens: copied into another session, the first one keeps its tokens.
  std::vector<model::Token> branch(a.begin(), a.begin() + 6);
  branch.push_back(a[7]);
  branch.push_back(a[8]);
  size_t s3 = cache.acquire(0, branch, &reused);
  CHECK(reused == 6);
  CHECK(s3 != s1);
  CHECK(cache.stats().copied == 1);
  CHECK(cache.session(s1).n_past() == int(longer.size()));
  cache.release(s3);

  // A repeated prompt reuses all but its last token (evaluated again for its logits).
  size_t s4 = cache.acquire(0, longer, &reused);
  CHECK(reused == int(longer.size()) - 1);
  cache.release(s4);

  // Room: with every session idle, make_room drops them, least recently used first, until the bytes fit.
  CHECK(cache.make_room(pool.budget_bytes() - pool.page_bytes()));
  CHECK(cache.stats().dropped >= 1);
  CHECK_FALSE(cache.make_room(pool.budget_bytes() + 1));
}

/// Whether `s` ends with a whole UTF-8 character (or is empty): the last lead byte is followed by exactly as
/// many continuation bytes as it announces. A lead byte alone at the end is half a character, and so is a 3- or
/// 4-byte character cut after its 2nd or 3rd byte, which ends in a continuation byte.
bool ends_with_whole_character(std::string_view s) {
  size_t continuations = 0;
  while (continuations < s.size() && (static_cast<unsigned char>(s[s.size() - 1 - continuations]) & 0xC0) == 0x80)
    ++continuations;
  if (continuations == s.size()) return s.empty();  // only continuation bytes: no lead byte at all
  const unsigned char lead = static_cast<unsigned char>(s[s.size() - 1 - continuations]);
  const size_t length = lead < 0x80 ? 1 : (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 0;
  return length == continuations + 1;
}

TEST_CASE("serve text stream: the whole-character check itself rejects every cut of a 2-, 3- and 4-byte character") {
  for (const std::string character : {"\xc3\xa9", "\xe2\x80\x94", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xf1\x9f\x9a\x80"}) {
    const std::string text = "a" + character;
    CHECK(ends_with_whole_character(text));
    CHECK(ends_with_whole_character(text + "b"));
    for (size_t cut = 1; cut < character.size(); ++cut) {
      CAPTURE(character.size());
      CAPTURE(cut);
      CHECK_FALSE(ends_with_whole_character(text.substr(0, 1 + cut)));
    }
  }
  CHECK(ends_with_whole_character(""));
  CHECK_FALSE(ends_with_whole_character("\x80"));
}

TEST_CASE("serve text stream: shown text never holds a stop string or half a character, and adds up to the final text") {
  std::mt19937 rng(7);
  const std::vector<std::string> texts = {"Hello world. STOP here", "caf\xc3\xa9 au lait\xe2\x80\x94ok", "abcabcab",
                                          "no stop at all \xf0\x9f\x98\x80!",
                                          "\xe4\xb8\xad\xf0\x9f\x98\x80\xc3\xa9\xe2\x80\x94\xf0\x9f\x98\x80"};
  const std::vector<std::vector<std::string>> stops = {{"STOP"}, {"lait"}, {"cab", "bca"}, {"zzz"}, {},
                                                       {"\xf0\x9f\x98\x80!"}};
  // The ways a text arrives: cut in two at every byte (so every cut position of every character is met), one
  // byte at a time, and in random pieces of 1 to 4 bytes.
  for (const std::string& text : texts)
    for (const auto& stop : stops) {
      std::vector<std::vector<size_t>> ways;
      for (size_t cut = 1; cut < text.size(); ++cut) ways.push_back({cut, text.size() - cut});
      ways.push_back(std::vector<size_t>(text.size(), 1));
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<size_t> pieces;
        for (size_t left = text.size(); left > 0;) {
          const size_t n = std::min(left, size_t(1 + rng() % 4));
          pieces.push_back(n);
          left -= n;
        }
        ways.push_back(pieces);
      }
      for (const std::vector<size_t>& pieces : ways) {
        serve::TextStream stream(stop);
        std::string shown;
        size_t at = 0;
        for (size_t n : pieces) {
          if (stream.stopped()) break;
          shown += stream.append(std::string_view(text).substr(at, n));
          at += n;
          // Never a partial UTF-8 character at the end of what is shown.
          CAPTURE(at);
          CHECK(ends_with_whole_character(shown));
        }
        const std::string final_text = stream.text();
        shown += stream.finish(final_text);
        CHECK(shown == final_text);
        size_t first = std::string::npos;
        for (const std::string& s : stop) first = std::min(first, text.find(s));
        CHECK(final_text == text.substr(0, first));
        CHECK(stream.stopped() == (first != std::string::npos));
      }
    }
}

}  // namespace
}  // namespace choreo
