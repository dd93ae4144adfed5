// The workflow interpreter (runtime/exec/interpreter.h): each test states a property of a run — equality with
// the plain chat path where the engine guarantees it, batching of fan-outs, loop control, bindings — or an
// error a user can cause.

#include "runtime/exec/interpreter.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "tests/reference/reference.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

using model::Token;
using runtime::Mode;

using Loaded = testing::LoadedModel;

const model::Model& stories() { return *testing::stories260k().model; }

const model::Model& smol() { return *testing::smollm2().model; }

/// SmolLM2 with its weights converted to F32 by llama.cpp: no 8-bit rounding of activations, so a workflow's
/// batched prefills and a plain session's one-token steps differ in the last bits of a logit at most, and
/// greedy decoding picks the same tokens (on the Q4_1 file they can differ where two logits nearly tie).
const model::Model& smol_f32() {
  static testing::LoadedModel loaded(testing::smollm2_f32_path());
  return *loaded.model;
}

std::string read_workflow_file(const std::string& name) {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  const std::filesystem::path path = std::filesystem::path(src ? src : ".") / "workflows" / name;
  std::ifstream in(testing::require_file(path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Runs workflow text on a fresh engine (own page pool) in `mode`.
exec::RunResult run(const model::Model& m, const std::string& text, const exec::RunArguments& arguments = {},
                    Mode mode = Mode::Choreo) {
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  runtime::Engine engine(m, pool, mode);
  return exec::run_workflow(dsl::parse_workflow(text, "test.yaml"), engine, arguments);
}

const exec::MessageRecord& message(const exec::RunResult& r, const std::string& name) {
  auto it = std::find_if(r.messages.begin(), r.messages.end(), [&](auto& m) { return m.name == name; });
  REQUIRE_MESSAGE(it != r.messages.end(), "no message ", name);
  return *it;
}

/// The error message a run throws (empty if it succeeds).
std::string run_error(const model::Model& m, const std::string& text, const exec::RunArguments& arguments) {
  try {
    run(m, text, arguments);
  } catch (const InputError& e) {
    return e.what();
  }
  return {};
}

/// The plain chat prompt of a system and a user turn plus the assistant's generation prompt, rendered by the
/// chat template as a whole (not turn by turn) and tokenised once, with the BOS the model adds.
std::vector<Token> plain_chat_prompt(const model::Model& m, const std::string& system,
                                     const std::string& user) {
  const std::string text = model::render_chat(m.chat_format(), {{"system", system}, {"user", user}},
                                              /*add_generation_prompt=*/true);
  std::vector<Token> prompt;
  if (m.vocab().add_bos()) prompt.push_back(m.vocab().bos());
  for (Token t : m.vocab().tokenize(text, false, true)) prompt.push_back(t);
  return prompt;
}

/// The first `n` tokens greedy decoding generates on a plain KV-cache session over `prompt`.
std::vector<Token> plain_greedy(const model::Model& m, const std::vector<Token>& prompt, size_t n) {
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(256) << 20);
  model::Session session(m, pool);
  std::vector<float> logits;
  session.eval(prompt, &logits);
  std::vector<Token> out;
  while (out.size() < n) {
    out.push_back(model::argmax(logits));
    if (out.size() < n) session.eval(std::span<const Token>(&out.back(), 1), &logits);
  }
  return out;
}

/// The tokens the decode `name` was placed after (its parents' tokens in order, then its header) with BOS.
std::vector<Token> decode_context(const model::Model& m, const exec::RunResult& r, const std::string& name,
                                  std::vector<Token>* generated) {
  const exec::MessageRecord& d = message(r, name);
  std::vector<Token> out;
  if (m.vocab().add_bos()) out.push_back(m.vocab().bos());
  for (const std::string& parent : d.parents) {
    const auto& tokens = message(r, parent).tokens;
    out.insert(out.end(), tokens.begin(), tokens.end());
  }
  const size_t header = d.tokens.size() - size_t(d.n_generated);
  out.insert(out.end(), d.tokens.begin(), d.tokens.begin() + long(header));
  generated->assign(d.tokens.begin() + long(header), d.tokens.end());
  return out;
}

const char* kQuestion = "What is the capital of France?";

TEST_CASE("hello.yaml runs on stories260K in every mode, the two plain-chat baselines agree") {
  const std::string text = read_workflow_file("hello.yaml");
  exec::RunArguments args{{{"question", "Tell me about a cat."}}, {}};
  std::map<Mode, exec::RunResult> results;
  for (Mode mode : {Mode::Choreo, Mode::Prefix, Mode::Naive}) {
    results[mode] = run(stories(), text, args, mode);
    const exec::RunResult& r = results[mode];
    REQUIRE(r.messages.size() == 3);
    CHECK(r.output == message(r, "reply").text);  // output: "{{ reply }}"
    CHECK(message(r, "reply").parents == std::vector<std::string>{"system", "ask"});
    CHECK(message(r, "ask").text == "Tell me about a cat.");
  }
  // Prefix and naive both decode over the plain concatenation (F32 model: equal up to float rounding).
  CHECK(results[Mode::Prefix].output == results[Mode::Naive].output);
  // A model without a chat template gets ChatML's turn markers (as text): the reply header is the assistant
  // turn's prefix.
  const exec::MessageRecord& reply = results[Mode::Choreo].messages[2];
  const auto header = stories().vocab().tokenize("<|im_start|>assistant\n", false, true);
  REQUIRE(reply.tokens.size() >= header.size());
  CHECK(std::equal(header.begin(), header.end(), reply.tokens.begin()));
}

TEST_CASE(
    "hello.yaml on SmolLM2 in F32: the messages spell the plain chat prompt, every mode decodes it "
    "greedily") {
  const model::Model& m = smol_f32();
  const std::string text = read_workflow_file("hello.yaml");
  const exec::RunArguments args{{{"question", kQuestion}}, {}};
  const auto prompt = plain_chat_prompt(m, "You are a concise, friendly assistant.", kQuestion);
  for (Mode mode : {Mode::Choreo, Mode::Prefix, Mode::Naive}) {
    CAPTURE(runtime::mode_name(mode));
    const exec::RunResult r = run(m, text, args, mode);
    std::vector<Token> generated;
    CHECK(decode_context(m, r, "reply", &generated) == prompt);  // token for token
    CHECK(r.output == message(r, "reply").text);
    // `ask` is encoded over `system`: a prefix chain, so every mode is the plain chat run, token for token.
    REQUIRE(!generated.empty());
    CHECK(generated == plain_greedy(m, prompt, generated.size()));
  }
}

// hello.yaml with the question encoded over the system message: the prefix chain where the engine's master
// equivalence makes the choreographed decode the plain chat decode.
const char* kChain = R"Y(
name: chain
inputs: {question: string}
sampling: {temperature: 0, max_tokens: 24}
messages:
  system: {role: system, text: "You are a concise, friendly assistant."}
steps:
  - prefill: {as: ask, role: user, text: "{{ question }}", parents: [system]}
  - decode: {as: reply, role: assistant, parents: [system, ask]}
output: "{{ reply }}"
)Y";

TEST_CASE(
    "a prefix chain decodes what a plain session generates on the chat prompt, in every mode (F32 weights)") {
  const model::Model& m = smol_f32();
  const auto prompt = plain_chat_prompt(m, "You are a concise, friendly assistant.", kQuestion);
  for (Mode mode : {Mode::Choreo, Mode::Prefix, Mode::Naive}) {
    CAPTURE(runtime::mode_name(mode));
    const exec::RunResult r = run(m, kChain, {{{"question", kQuestion}}, {}}, mode);
    std::vector<Token> generated;
    CHECK(decode_context(m, r, "reply", &generated) == prompt);
    REQUIRE(!generated.empty());
    CHECK(generated == plain_greedy(m, prompt, generated.size()));
  }
}

TEST_CASE("a `for` fan-out is one batched engine call, results form a list in branch order") {
  const char* fan = R"Y(
name: fan
params: {n: 3}
messages: {story: {text: "Once upon a time"}}
steps:
  - decode: {as: "c[i]", for: "i in range(n)", header: " there", parents: [story], max_tokens: 4, seed: "7 + i"}
output: "{{ len(c) }} {{ c[n - 1] }}"
)Y";
  const exec::RunResult r = run(stories(), fan);
  REQUIRE(r.batches.size() == 2);
  CHECK(r.batches[0].kind == "prefill");
  CHECK(r.batches[0].size == 1);
  CHECK(r.batches[1].kind == "decode");
  CHECK(r.batches[1].size == 3);
  CHECK(r.output == "3 " + message(r, "c[2]").text);
  // A branch of the batch is the same call made alone (same seed): here branch 1 as a one-element fan-out.
  const exec::RunResult one = run(stories(), fan, {{}, {{"n", "2"}}});
  CHECK(message(one, "c[1]").tokens == message(r, "c[1]").tokens);
}

TEST_CASE("`repeat` stops when `until` becomes true, and otherwise runs its whole range") {
  const char* loop = R"Y(
name: loop
params: {limit: 6, stop_at: 2}
messages: {story: {text: "Once upon a time"}}
steps:
  - repeat: "r in range(limit)"
    until: "len(s) == stop_at"
    steps:
      - decode: {as: "s[r]", header: " there", parents: [story], max_tokens: 2}
output: "{{ len(s) }}"
)Y";
  const exec::RunResult early = run(stories(), loop);
  CHECK(early.output == "2");
  CHECK(early.batches.size() == 3);  // the static message, then one decode per iteration
  const exec::RunResult full = run(stories(), loop, {{}, {{"limit", "3"}, {"stop_at", "10"}}});
  CHECK(full.output == "3");
}

TEST_CASE("`let`, `select` and `when` bind values, pick messages and skip calls") {
  const char* pick = R"Y(
name: pick
messages:
  a: {text: "Once upon a time"}
  b: {text: "There was a dog"}
steps:
  - let: {choice: "1", flag: "false"}
  - select: "[a, b][choice]"
    as: chosen
  - decode: {as: c, header: " and", parents: [chosen], max_tokens: 3, temperature: 0}
  - decode: {as: d, header: " x", parents: [a], when: "flag", max_tokens: 2}
output: "{{ chosen }}|{{ choice + 1 }}"
)Y";
  const exec::RunResult r = run(stories(), pick);
  CHECK(message(r, "c").parents == std::vector<std::string>{"b"});
  CHECK(std::none_of(r.messages.begin(), r.messages.end(), [](auto& m) { return m.name == "d"; }));
  CHECK(r.output == "There was a dog|2");
}

TEST_CASE("inputs and params: unknown keys, wrong types and missing values are errors naming the key") {
  const std::string hello = read_workflow_file("hello.yaml");
  CHECK(run_error(stories(), hello, {{{"questoin", "x"}}, {}}).find("unknown input `questoin`") !=
        std::string::npos);
  CHECK(run_error(stories(), hello, {}).find("input `question` has no value") != std::string::npos);
  CHECK(
      run_error(stories(), hello, {{{"question", "x"}}, {{"rounds", "2"}}}).find("unknown param `rounds`") !=
      std::string::npos);
  const char* typed = R"Y(
name: typed
inputs: {n: int, x: float}
params: {verbose: false, tags: [1, 2]}
messages: {m: {text: "{{ n + x }} {{ verbose }} {{ len(tags) }}"}}
steps:
  - decode: {as: d, header: " ok", parents: [m], max_tokens: 1}
output: "{{ m }}"
)Y";
  CHECK(run_error(stories(), typed, {{{"n", "abc"}, {"x", "1"}}, {}}).find("input `n` must be an int") !=
        std::string::npos);
  CHECK(run_error(stories(), typed, {{{"n", "1"}, {"x", "1e"}}, {}}).find("input `x` must be a float") !=
        std::string::npos);
  CHECK(run_error(stories(), typed, {{{"n", "1"}, {"x", "2"}}, {{"verbose", "yes"}}})
            .find("param `verbose` must be a bool") != std::string::npos);
  const exec::RunResult r =
      run(stories(), typed, {{{"n", "2"}, {"x", "0.5"}}, {{"verbose", "true"}, {"tags", "[1, 2, 3]"}}});
  CHECK(r.output == "2.5 true 3");
}

TEST_CASE("undeclared models and non-message parents are errors at their location") {
  const char* other_model = R"Y(
name: m
messages: {a: {text: "Once"}}
steps:
  - decode: {as: d, header: " x", parents: [a], model: other}
)Y";
  const std::string e1 = run_error(stories(), other_model, {});
  CHECK(e1.find("test.yaml:5:") != std::string::npos);
  CHECK(e1.find("unknown model `other`") != std::string::npos);
  const char* number_parent = R"Y(
name: p
messages: {a: {text: "Once"}}
steps:
  - let: {k: "3"}
  - decode: {as: d, header: " x", parents: [a, k]}
)Y";
  const std::string e2 = run_error(stories(), number_parent, {});
  CHECK(e2.find("test.yaml:6:") != std::string::npos);
  CHECK(e2.find("not a message") != std::string::npos);
}

TEST_CASE(
    "madpar.yaml runs end to end on SmolLM2 (short replies): rounds are batches over the others' answers") {
  std::string text = read_workflow_file("madpar.yaml");
  const size_t at = text.find("max_tokens: 512");
  REQUIRE(at != std::string::npos);
  text.replace(at, 15, "max_tokens: 6");  // keep the test short; the structure is the file's
  const exec::RunResult r =
      run(smol(), text, {{{"problem", "What is 2 + 3?"}}, {{"agents", "2"}, {"rounds", "2"}}});
  REQUIRE(r.batches.size() == 3);  // static messages, round 0, round 1
  CHECK(r.batches[1].size == 2);
  CHECK(r.batches[2].size == 2);
  CHECK(message(r, "answer[1][0]").parents == std::vector<std::string>{"start", "answer[0][1]", "debate"});
  CHECK(message(r, "answer[1][1]").parents == std::vector<std::string>{"start", "answer[0][0]", "debate"});
  for (const char* name : {"answer[0][0]", "answer[0][1]", "answer[1][0]", "answer[1][1]"})
    CHECK(message(r, name).n_generated >= 1);
}

}  // namespace
}  // namespace choreo
