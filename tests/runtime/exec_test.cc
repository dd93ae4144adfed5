// Calls files (runtime/exec, `choreo exec`): each result is what the engine gives for the same call made
// directly, and each malformed input is rejected before anything runs, naming its line.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <xxhash.h>

#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/calls.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/llama.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

using json = nlohmann::json;
using model::Token;
using runtime::DecodeRequest;
using runtime::Engine;

using Loaded = testing::LoadedModel;

const model::Model& stories() { return *testing::stories260k().model; }

/// An engine with its own page pool.
struct Bench {
  kv::PagePool pool;
  Engine engine;
  explicit Bench(const model::Model& m, runtime::Mode mode = runtime::Mode::Choreo)
      : pool(m.backend(), m.kv_layout(16), size_t(256) << 20), engine(m, pool, mode) {}
};

std::vector<json> run(Engine& e, const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out;
  exec::run_calls(in, "calls.jsonl", e, out);
  std::vector<json> lines;
  std::istringstream produced(out.str());
  for (std::string line; std::getline(produced, line);) lines.push_back(json::parse(line));
  return lines;
}

std::vector<Token> text_tokens(const model::Model& m, const std::string& s) {
  return m.vocab().tokenize(s, false, true);
}

std::vector<Token> ids(const json& j) { return j.get<std::vector<Token>>(); }

TEST_CASE("exec: the default seed is XXH3-64 of the id, as docs/exec.md says") {
  for (std::string_view id : {"", "a", "default seed", "answer[3][1]"}) {
    CAPTURE(id);
    CHECK(exec::default_seed(id) == XXH3_64bits(id.data(), id.size()));
  }
  CHECK(exec::default_seed("a") != exec::default_seed("b"));
}

TEST_CASE(
    "exec: a decode over a prefill generates what the engine generates for the same call made directly") {
  const model::Model& m = stories();
  Bench via_file(m);
  auto out = run(via_file.engine, R"({"op":"prefill","id":"story","text":"Once upon a time, there was a cat."}
{"op":"decode","id":"greedy","header":" The cat","parents":["story"],"max_tokens":24,"temperature":0}
{"op":"decode","id":"sampled","header":" One day","parents":["story"],"max_tokens":24,"temperature":0.9,"top_k":20,"top_p":0.9,"seed":7}
{"op":"decode","id":"default seed","header":" One day","parents":["story"],"max_tokens":24}
)");
  REQUIRE(out.size() == 4);

  Bench direct(m);
  auto story_tokens = text_tokens(m, "Once upon a time, there was a cat.");
  auto story = direct.engine.prefill({story_tokens, {}, {}, "", kv::Visibility::Public});
  CHECK(ids(out[0]["tokens"]) == story_tokens);
  CHECK(out[0]["start_pos"] == direct.engine.first_pos());
  CHECK(out[0]["end"] == direct.engine.first_pos() + int(story_tokens.size()));

  auto decode = [&](const std::string& header, model::SamplingParams sampling) {
    DecodeRequest d;
    d.header = text_tokens(m, header);
    d.parents = {{story.id, {}, {}}};
    d.sampling = sampling;
    d.max_tokens = 24;
    return direct.engine.decode(d);
  };
  auto greedy = decode(" The cat", {0.0f, exec::kDefaultTopK, exec::kDefaultTopP, 0});
  auto sampled = decode(" One day", {0.9f, 20, 0.9f, 7});
  auto defaulted = decode(" One day", {exec::kDefaultTemperature, exec::kDefaultTopK, exec::kDefaultTopP,
                                       exec::default_seed("default seed")});
  for (auto [line, want] : std::initializer_list<std::pair<int, runtime::DecodeResult*>>{
           {1, &greedy}, {2, &sampled}, {3, &defaulted}}) {
    CAPTURE(line);
    const json& got = out[line];
    CHECK(ids(got["tokens"]) == want->generated);
    CHECK(got["stop_reason"] == want->stop_reason);
    CHECK(got["start_pos"] == want->stats.start_pos);
    CHECK(got["end"] == want->stats.start_pos + int(got["header_tokens"].size() + want->generated.size()));
    CHECK(got["n_reused"] == int(story_tokens.size()));
    // The text is the generated pieces (EOG excluded), so header + text continues the story verbatim.
    std::string pieces;
    for (Token t : want->generated)
      if (!m.vocab().is_eog(t)) pieces += m.vocab().token_to_piece(t);
    CHECK(got["text"] == pieces);
    CHECK(got["line"] == line + 1);
    CHECK(got["ttft_ms"].get<double>() <= got["total_ms"].get<double>());
  }
  CHECK(out[2]["tokens"] != out[3]["tokens"]);  // the default seed is not the explicit one (not vacuous)
}

TEST_CASE("exec: a batch line gives one result line per call, in order, each equal to the call made alone") {
  const model::Model& m = stories();
  Bench via_file(m);
  auto out = run(via_file.engine, R"({"op":"prefill","id":"s","text":"Lily had a red ball."}
[{"op":"prefill","id":"p1","text":" She threw it.","parents":["s"]},{"op":"prefill","id":"p2","text":" Her dog ran.","parents":["s"]}]
[{"op":"decode","id":"d1","header":" Then","parents":["s","p1"],"max_tokens":10,"seed":1},{"op":"decode","id":"d2","header":" The dog","parents":["s","p2"],"max_tokens":14,"seed":2},{"op":"decode","id":"d3","header":" Lily","parents":["s"],"max_tokens":6,"temperature":0}]
)");
  REQUIRE(out.size() == 6);
  const char* order[] = {"s", "p1", "p2", "d1", "d2", "d3"};
  for (size_t i = 0; i < 6; ++i) CHECK(out[i]["id"] == order[i]);
  CHECK(out[1]["line"] == 2);
  CHECK(out[5]["line"] == 3);
  // p1 and p2 both start right after s; they were encoded in one batch but independently.
  CHECK(out[1]["start_pos"] == out[0]["end"]);
  CHECK(out[2]["start_pos"] == out[0]["end"]);

  Bench direct(m);
  auto s =
      direct.engine.prefill({text_tokens(m, "Lily had a red ball."), {}, {}, "", kv::Visibility::Public}).id;
  auto p1 =
      direct.engine.prefill({text_tokens(m, " She threw it."), {{s, {}, {}}}, {}, "", kv::Visibility::Public})
          .id;
  auto p2 =
      direct.engine.prefill({text_tokens(m, " Her dog ran."), {{s, {}, {}}}, {}, "", kv::Visibility::Public})
          .id;
  struct Want {
    const char* header;
    std::vector<kv::MessageId> parents;
    int max_tokens;
    model::SamplingParams sampling;
  };
  Want wants[] = {{" Then", {s, p1}, 10, {0.8f, 40, 0.95f, 1}},
                  {" The dog", {s, p2}, 14, {0.8f, 40, 0.95f, 2}},
                  {" Lily", {s}, 6, {0.0f, 40, 0.95f, exec::default_seed("d3")}}};
  for (int i = 0; i < 3; ++i) {
    DecodeRequest d;
    d.header = text_tokens(m, wants[i].header);
    for (auto p : wants[i].parents) d.parents.push_back({p, {}, {}});
    d.max_tokens = wants[i].max_tokens;
    d.sampling = wants[i].sampling;
    CHECK(ids(out[3 + i]["tokens"]) == direct.engine.decode(d).generated);
  }
}

TEST_CASE("exec: \"tokens\" and \"header_tokens\" are used exactly as given, bypassing the tokenizer") {
  const model::Model& m = stories();
  // Ids that no tokenisation of a text would give in this order, so the test would see a re-tokenisation.
  const std::vector<Token> message = {378, 261, 407, 403, 426};
  const std::vector<Token> header = {338};
  Bench via_file(m);
  auto out = run(via_file.engine, fmt::format(
                                      R"({{"op":"prefill","id":"m","tokens":{}}}
{{"op":"decode","id":"d","header_tokens":{},"parents":["m"],"max_tokens":12,"temperature":0}}
)",
                                      json(message).dump(), json(header).dump()));
  REQUIRE(out.size() == 2);
  CHECK(ids(out[0]["tokens"]) == message);
  CHECK(ids(out[1]["header_tokens"]) == header);

  Bench direct(m);
  auto id = direct.engine.prefill({message, {}, {}, "", kv::Visibility::Public}).id;
  DecodeRequest d;
  d.header = header;
  d.parents = {{id, {}, {}}};
  d.max_tokens = 12;
  d.sampling.temperature = 0;
  CHECK(ids(out[1]["tokens"]) == direct.engine.decode(d).generated);
}

TEST_CASE(
    "exec: logprobs are the log-softmax of the logits, the first of top is the max and is the greedy token") {
  const model::Model& m = stories();
  const int k = 5;
  Bench via_file(m);
  auto out = run(via_file.engine, R"({"op":"prefill","id":"s","text":"Tom saw a big dog."}
{"op":"decode","id":"d","header":" The dog","parents":["s"],"exact_tokens":12,"temperature":0,"logprobs":5}
)");
  REQUIRE(out.size() == 2);
  const json& steps = out[1]["logprobs"];
  REQUIRE(steps.size() == 12);
  CHECK_FALSE(out[0].contains("logprobs"));

  // Independent recomputation: the same call's logits from the engine, log-softmax in double.
  Bench direct(m);
  auto s =
      direct.engine.prefill({text_tokens(m, "Tom saw a big dog."), {}, {}, "", kv::Visibility::Public}).id;
  DecodeRequest d;
  d.header = text_tokens(m, " The dog");
  d.parents = {{s, {}, {}}};
  d.exact_tokens = 12;
  d.sampling.temperature = 0;
  d.record_logits = true;
  auto r = direct.engine.decode(d);
  for (size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(i);
    const json& step = steps[i];
    const std::vector<float>& logits = r.logits[i];
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (float l : logits) sum += std::exp(double(l) - mx);
    auto logprob = [&](Token t) { return double(logits[t]) - mx - std::log(sum); };

    REQUIRE(step["top"].size() == k);
    CHECK(step["token"] == out[1]["tokens"][i]);
    CHECK(step["text"] == m.vocab().token_to_piece(step["token"].get<Token>(), true));
    CHECK(step["logprob"].get<double>() ==
          doctest::Approx(logprob(step["token"].get<Token>())).epsilon(1e-5));
    // Greedy: the chosen token is top[0], which is the arg max of the logits.
    CHECK(step["token"] == step["top"][0][0]);
    CHECK(step["logprob"] == step["top"][0][1]);
    CHECK(step["top"][0][0].get<Token>() == model::argmax(logits));
    double mass = 0;
    for (int j = 0; j < k; ++j) {
      const json& entry = step["top"][j];
      CHECK(entry[1].get<double>() == doctest::Approx(logprob(entry[0].get<Token>())).epsilon(1e-5));
      CHECK(entry[2] == m.vocab().token_to_piece(entry[0].get<Token>(), true));
      if (j > 0) CHECK(entry[1].get<double>() <= step["top"][j - 1][1].get<double>());
      mass += std::exp(entry[1].get<double>());
    }
    CHECK(mass <= 1.0 + 1e-5);
    // Nothing outside the top k beats its last entry.
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    CHECK(step["top"][k - 1][1].get<double>() ==
          doctest::Approx(double(sorted[k - 1]) - mx - std::log(sum)).epsilon(1e-5));
  }
}

TEST_CASE("exec: the naive baseline generates what choreo mode generates (greedy), recomputing its parents") {
  const model::Model& m = stories();
  const std::string script = R"({"op":"prefill","id":"a","text":"Once upon a time, there was a frog."}
{"op":"decode","id":"b","header":" The frog","parents":["a"],"exact_tokens":10,"temperature":0}
{"op":"decode","id":"c","header":" Then","parents":["a","b"],"exact_tokens":10,"temperature":0}
)";
  Bench choreo(m), naive(m, runtime::Mode::Naive);
  auto with_cache = run(choreo.engine, script);
  auto baseline = run(naive.engine, script);
  REQUIRE(baseline.size() == 3);
  for (int i : {1, 2}) CHECK(baseline[i]["tokens"] == with_cache[i]["tokens"]);
  CHECK(baseline[2]["n_reused"] == 0);
  CHECK(with_cache[2]["n_reused"] ==
        with_cache[0]["tokens"].size() + with_cache[1]["header_tokens"].size() + 10);
  // Both modes end the last call at the same logical position.
  CHECK(baseline[2]["end"] == with_cache[2]["end"]);
}

struct BadInput {
  const char* what;
  std::string input;
  int line;
  std::string message;         // a substring of the error message
  std::string column_at = {};  // when set, the error's column is where this text starts on that line
};

TEST_CASE("exec: malformed calls are rejected before anything runs, naming file, line and column") {
  const model::Model& m = stories();
  const std::string story = R"({"op":"prefill","id":"story","text":"Once upon a time"})"
                            "\n";
  const std::vector<BadInput> cases = {
      {"unknown ref", story + R"({"op":"decode","id":"d","header":" The","parents":["storyy"]})", 2,
       "unknown parent 'storyy' — did you mean 'story'?", "\"storyy\""},
      {"forward ref",
       story +
           R"({"op":"decode","id":"d","header":" The","parents":["later"]})"
           "\n" +
           story + R"({"op":"prefill","id":"later","text":"x"})",
       2, "forward reference: parent 'later' is defined on line 4"},
      {"self ref", story + R"({"op":"prefill","id":"me","text":"x","parents":["story","me"]})", 2,
       "lists itself as a parent"},
      {"duplicate id", story + "\n" + story, 3, "'story' is already defined on line 1", "\"story\""},
      {"bad JSON", story + R"({"op":"prefill","id":"x" "text":"y"})", 2, "invalid JSON"},
      // Found by tests/fuzz/exec_fuzz: well-formed JSON whose number nlohmann cannot hold used to escape as an
      // uncaught json::out_of_range and abort the process.
      {"number beyond double range", story + R"({"op":"decode","id":"d","header":" A","parents":["story"],"max_tokens":1e999})", 2,
       "invalid JSON: number overflow parsing '1e999'", "1e999"},
      {"unknown op", story + R"({"op":"prefil","id":"x","text":"y"})", 2,
       "'prefil' is not an op — did you mean 'prefill'?", "\"prefil\""},
      {"unknown field",
       story + R"({"op":"decode","id":"d","header":" A","parents":["story"],"temprature":0})", 2,
       "unknown field 'temprature' — did you mean 'temperature'?", "\"temprature\""},
      {"wrong type", story + R"({"op":"decode","id":"d","header":" A","max_tokens":"64"})", 2,
       "field 'max_tokens' must be an integer, not a string", "\"64\""},
      {"negative offset",
       story + R"({"op":"decode","id":"d","header":" A","parents":[{"ref":"story","offset":-3}]})", 2,
       "parent 'story' has negative offset -3", "\"offset\""},
      {"negative new_offset", story + R"({"op":"prefill","id":"x","text":"y","new_offset":-1})", 2,
       "field 'new_offset' is -1, but must not be less than 0"},
      {"empty header", story + R"({"op":"decode","id":"d","header":"","parents":["story"]})", 2,
       "the header is empty"},
      {"decode without header", story + R"({"op":"decode","id":"d","parents":["story"]})", 2,
       "a decode needs a header"},
      {"context overflow",
       story + R"({"op":"decode","id":"d","header":" A","parents":["story"],"max_tokens":100000})", 2,
       "context overflow", "100000"},
      {"batch mixing ops",
       story +
           R"([{"op":"prefill","id":"p","text":"x"},{"op":"decode","id":"d","header":" A","parents":["story"]}])",
       2, "batch call #2: a batch must hold calls of one op"},
      {"same-batch ref",
       story +
           R"([{"op":"prefill","id":"p","text":"x"},{"op":"prefill","id":"q","text":"y","parents":["p"]}])",
       2, "parent 'p' is in the same batch"},
      {"decode field on a prefill", story + R"({"op":"prefill","id":"x","text":"y","max_tokens":3})", 2,
       "field 'max_tokens' belongs to decode calls"},
      {"token outside the vocabulary", R"({"op":"prefill","id":"x","tokens":[5, 99999]})", 1,
       "holds token id 99999, outside the vocabulary (0..511)"},
      {"role without a chat template", R"({"op":"prefill","id":"x","text":"hi","role":"user"})", 1,
       "needs a chat template"},
      {"key given twice", R"({"op":"prefill","id":"x","text":"a","text":"b"})", 1,
       "field 'text' is given twice"},
      {"not an object", "42", 1, "a line must hold a call object or a list of calls, not an integer"},
      {"missing id", R"({"op":"prefill","text":"a"})", 1, "call has no \"id\""},
      {"text and tokens", R"({"op":"prefill","id":"x","text":"a","tokens":[5]})", 1, "not both"},
      {"empty text", R"({"op":"prefill","id":"x","text":""})", 1, "the text is empty"},
      {"empty batch", "[]", 1, "empty batch"},
      {"max and exact tokens",
       story + R"({"op":"decode","id":"d","header":"A","max_tokens":3,"exact_tokens":3})", 2, "not both"},
      {"unknown parent field",
       story + R"({"op":"prefill","id":"x","text":"y","parents":[{"ref":"story","ofset":3}]})", 2,
       "unknown parent field 'ofset' — did you mean 'offset'?", "\"ofset\""},
      {"misspelt role", R"({"op":"prefill","id":"x","text":"hi","role":"assistent"})", 1,
       "'assistent' is not a role — did you mean 'assistant'?", "\"assistent\""},
      {"parents not a list", story + R"({"op":"prefill","id":"x","text":"y","parents":"story"})", 2,
       "field 'parents' must be a list of ids"},
      {"CRLF line endings",
       "{\"op\":\"prefill\",\"id\":\"a\",\"text\":\"b\"}\r\n{\"op\":\"prefill\",\"id\":\"c\",\"text\":\"d\","
       "\"parents\":[\"b\"]}\r\n",
       2, "unknown parent 'b'", "\"b\"]"},
      {"temperature out of range", story + R"({"op":"decode","id":"d","header":"A","temperature":-1})", 2,
       "field 'temperature' is -1, outside"},
      {"unknown repair policy", story + R"({"op":"decode","id":"d","header":"A","repair":"blend"})", 2,
       "unknown repair policy `blend`", "\"blend\""},
  };
  for (const BadInput& c : cases) {
    CAPTURE(c.what);
    Bench b(m);
    const size_t messages_before = b.engine.store().size();
    std::istringstream in(c.input);
    std::ostringstream out;
    try {
      exec::run_calls(in, "calls.jsonl", b.engine, out);
      FAIL("no error for: ", c.input);
    } catch (const InputError& e) {
      CAPTURE(e.render());
      CHECK(e.where().file == "calls.jsonl");
      CHECK(e.where().line == c.line);
      CHECK(e.message().find(c.message) != std::string::npos);
      CHECK(std::string(e.what()).find(fmt::format("calls.jsonl:{}", c.line)) == 0);
      if (!c.column_at.empty()) {
        std::istringstream lines(c.input);
        std::string text;
        for (int i = 0; i < c.line; ++i) std::getline(lines, text);
        CHECK(e.where().col == int(text.find(c.column_at)) + 1);
      }
    }
    CHECK(out.str().empty());                           // nothing printed
    CHECK(b.engine.store().size() == messages_before);  // nothing ran
  }
}

TEST_CASE("exec: a call's \"repair\" field repairs the parents it reads out of prefix and reports n_repaired") {
  Bench b(stories());
  const std::string calls = R"({"op":"prefill","id":"a","text":"Once upon a time"})"
                            "\n"
                            R"({"op":"prefill","id":"b","text":"Tom had a red ball."})"
                            "\n"
                            R"([{"op":"decode","id":"plain","header":" Then","parents":["a","b"],"max_tokens":3},)"
                            R"({"op":"decode","id":"fixed","header":" Then","parents":["a","b"],"max_tokens":3,)"
                            R"("repair":"first:2"}])";
  const std::vector<json> out = run(b.engine, calls);
  REQUIRE(out.size() == 4);
  CHECK_FALSE(out[2].contains("n_repaired"));
  CHECK(out[3]["n_repaired"] == 2);  // b is read out of prefix: its first 2 tokens recomputed
}

TEST_CASE("exec: invalid JSON reports the column where parsing failed") {
  Bench b(stories());
  std::istringstream in("{\"op\":\"prefill\",\"id\":\"x\",\"text\":\"y\",}\n");
  std::ostringstream out;
  try {
    exec::run_calls(in, "f.jsonl", b.engine, out);
    FAIL("accepted a trailing comma");
  } catch (const InputError& e) {
    CHECK(e.where().line == 1);
    CHECK(e.where().col ==
          int(std::string("{\"op\":\"prefill\",\"id\":\"x\",\"text\":\"y\",}").find('}')) + 1);
  }
}

TEST_CASE("exec: a context overflow found only while running names its line, earlier lines were written") {
  const model::Model& m = stories();
  Bench b(m);
  const int n_ctx = m.config().n_ctx_train;
  // The static check assumes "first" generates nothing, so "second" fits exactly on paper; but "first"
  // generates at least one token, so the real placement overflows by at least one position.
  const int header_a = int(text_tokens(m, " Tom").size()), header_b = int(text_tokens(m, " Then").size());
  const int budget = n_ctx - b.engine.first_pos() - header_a - header_b;
  std::string input =
      fmt::format(R"({{"op":"decode","id":"first","header":" Tom","max_tokens":5,"temperature":0}}

{{"op":"decode","id":"second","header":" Then","parents":["first"],"max_tokens":{}}}
)",
                  budget);
  std::istringstream in(input);
  std::ostringstream out;
  try {
    exec::run_calls(in, "calls.jsonl", b.engine, out);
    FAIL("no overflow");
  } catch (const InputError& e) {
    CAPTURE(e.render());
    CHECK(e.where().line == 3);
    CHECK(e.message().find("call 'second'") == 0);
    CHECK(e.message().find("context overflow") != std::string::npos);
  }
  CHECK(json::parse(out.str())["id"] == "first");  // exactly one line, the first call's
}

TEST_CASE("exec: role messages at default offsets reproduce the plain chat prompt, across turns (ChatML)") {
  Loaded& smol = testing::smollm2();
  const model::Model& m = *smol.model;
  REQUIRE(m.chat_format() == model::ChatFormat::ChatML);
  Bench b(m);
  auto out =
      run(b.engine, R"({"op":"prefill","id":"sys","role":"system","text":"You are a helpful assistant."}
{"op":"prefill","id":"u1","role":"user","text":"What is the capital of France?","parents":["sys"]}
{"op":"decode","id":"a1","role":"assistant","parents":["sys","u1"],"max_tokens":24,"temperature":0}
{"op":"prefill","id":"u2","role":"user","text":"And of Italy?","parents":["sys","u1","a1"]}
{"op":"decode","id":"a2","role":"assistant","parents":["sys","u1","a1","u2"],"max_tokens":1,"temperature":0}
)");
  REQUIRE(out.size() == 5);
  // The first turn, token for token: the chain equals the tokenised plain prompt with its generation prompt.
  std::vector<model::ChatMessage> chat = {{"system", "You are a helpful assistant."},
                                          {"user", "What is the capital of France?"}};
  std::vector<Token> chain = ids(out[0]["tokens"]);
  for (const json& part : {out[1]["tokens"], out[2]["header_tokens"]})
    for (Token t : ids(part)) chain.push_back(t);
  CHECK(chain == m.vocab().tokenize(model::render_chat(m.chat_format(), chat, true), false, true));
  // Across the generated reply: every message's tokens, in order, spell the plain transcript with the reply
  // in it (the turn closing the model did not generate itself starts the next user message).
  std::vector<Token> all;
  for (const json& o : out) {
    for (Token t : ids(o.contains("header_tokens") ? o["header_tokens"] : o["tokens"])) all.push_back(t);
    if (o["op"] == "decode" && o["id"] == "a1")
      for (Token t : ids(o["tokens"])) all.push_back(t);
  }
  chat.push_back({"assistant", out[2]["text"].get<std::string>()});
  chat.push_back({"user", "And of Italy?"});
  MESSAGE("reply: ", out[2]["text"].get<std::string>(), " (", out[2]["stop_reason"].get<std::string>(), ")");
  CHECK(m.vocab().detokenize(all, true) == model::render_chat(m.chat_format(), chat, true));
  // Positions chain at default offsets: each message starts where the previous one ended.
  for (size_t i = 1; i < out.size(); ++i) CHECK(out[i]["start_pos"] == out[i - 1]["end"]);
}

}  // namespace
}  // namespace choreo
