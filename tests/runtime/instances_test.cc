// Many workflow instances on one engine (runtime/exec/instances.h, scheduler.h) and `--no-leak`
// (runtime/exec/leak_guard.h). Properties: batching instances together changes nothing but the number of
// engine batches; an instance's error stays with it; with --no-leak, what one agent keeps private cannot
// change another agent's logits, while without it, it does (the Prisoner's Dilemma leak).

#include "runtime/exec/instances.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "dsl/arguments.h"
#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/exec/leak_guard.h"
#include "runtime/exec/scheduler.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

const model::Model& stories() { return *testing::stories260k().model; }

const exec::MessageRecord& message(const exec::RunResult& r, const std::string& name) {
  auto it = std::find_if(r.messages.begin(), r.messages.end(), [&](auto& m) { return m.name == name; });
  REQUIRE_MESSAGE(it != r.messages.end(), "no message ", name);
  return *it;
}

// A small debate: a shared opening, two agents answering in parallel, then each seeing the other's answer.
const char* kDebate = R"yaml(
name: debate
inputs: {topic: string}
sampling: {temperature: 0.9, top_k: 20, max_tokens: 12, seed: 3}
messages:
  opening: {text: "Once upon a time there was a little dog."}
  ask: {text: "{{ topic }}"}
steps:
  - decode: {as: "answer[i]", for: "i in range(2)", header: "Then", parents: [opening, ask]}
  - decode: {as: "reply[i]", for: "i in range(2)", header: "So", parents: [opening, ask, "answer[1 - i]"],
             max_tokens: "6 + 3 * i"}
output: "{{ reply[0] }}|{{ reply[1] }}"
)yaml";

std::vector<exec::RunArguments> topics() {
  std::vector<exec::RunArguments> out;
  for (const char* t : {"The sun was hot.", "Lily had a red ball.", "Tom went to the park.", "It was night."})
    out.push_back({{{"topic", t}}, {}});
  return out;
}

TEST_CASE("instances batched together produce what each produces alone, in fewer engine batches") {
  const dsl::Workflow workflow = dsl::parse_workflow(kDebate, "debate.yaml");
  const std::vector<exec::RunArguments> rows = topics();
  exec::RunHooks hooks;
  hooks.record_logits = [](const std::string&) { return true; };

  // In every mode, an instance's logits are bit-identical whatever ran before or beside it: batches are
  // batch invariant, choreo shares only identical encodings, and the prefix baseline reuses only the
  // instance's own sequences (its prefix scope).
  for (runtime::Mode mode : {runtime::Mode::Choreo, runtime::Mode::Prefix}) {
    CAPTURE(runtime::mode_name(mode));
    std::vector<exec::RunResult> alone;
    for (const exec::RunArguments& row : rows) {
      kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
      runtime::Engine engine(stories(), pool, mode);
      alone.push_back(exec::run_workflow(workflow, engine, row, hooks));
    }

    for (int concurrency : {1, 2, 4}) {
      CAPTURE(concurrency);
      kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
      runtime::Engine engine(stories(), pool, mode);
      exec::InstancesOptions options;
      options.concurrency = concurrency;
      options.hooks = [&](size_t) { return hooks; };
      const std::vector<exec::InstanceOutcome> together = exec::run_instances(workflow, engine, rows, options);
      REQUIRE(together.size() == rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        REQUIRE(!together[i].error);
        CHECK(together[i].result.output == alone[i].output);
        for (const char* name : {"answer[0]", "answer[1]", "reply[0]", "reply[1]"}) {
          CHECK(message(together[i].result, name).tokens == message(alone[i], name).tokens);
          CHECK(message(together[i].result, name).logits == message(alone[i], name).logits);
        }
      }
      if (mode != runtime::Mode::Choreo) continue;
      // The shared opening is encoded once for all instances: every later instance reuses it.
      int computed_openings = 0;
      for (const exec::InstanceOutcome& o : together) computed_openings += message(o.result, "opening").n_computed > 0;
      CHECK(computed_openings == 1);
    }
  }

  // With 4 instances in flight, the scheduler merges their calls: 1 static prefill + 2 decodes per instance
  // become 3 engine batches when all four instances move in lockstep.
  kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(stories(), pool);
  exec::BatchScheduler scheduler(engine);
  std::vector<exec::RunResult> results(rows.size());
  const auto errors = scheduler.run(rows.size(), 4, [&](size_t i, exec::CallSink& sink) {
    results[i] = exec::run_workflow(workflow, sink, rows[i]);
  });
  for (const auto& e : errors) CHECK(!e);
  CHECK(scheduler.n_batches() == 3);
  CHECK(scheduler.n_requests() == 4 * (2 + 2 + 2));
}

TEST_CASE("an instance's error stops that instance only") {
  const dsl::Workflow workflow = dsl::parse_workflow(kDebate, "debate.yaml");
  std::vector<exec::RunArguments> rows = topics();
  rows[1].inputs["topic"] = "";  // an empty message is an error at run time
  kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(stories(), pool);
  exec::InstancesOptions options;
  options.concurrency = 4;
  const auto outcomes = exec::run_instances(workflow, engine, rows, options);
  CHECK(!outcomes[0].error);
  CHECK(outcomes[1].error);
  CHECK(!outcomes[2].error);
  CHECK(!outcomes[3].error);
  CHECK(!outcomes[3].result.output.empty());
}

TEST_CASE("input rows: keys naming inputs are used, others ignored, bad lines are located errors") {
  const dsl::Workflow workflow = dsl::parse_workflow(kDebate, "debate.yaml");
  const std::string path = (std::filesystem::temp_directory_path() / "choreo_rows_test.jsonl").string();
  auto rows_of = [&](const std::string& text) {
    std::ofstream(path) << text;
    return exec::read_input_rows(path, workflow, {});
  };
  const auto rows = rows_of("{\"topic\": \"a\", \"answer\": 4}\n\n{\"topic\": 7}\n");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].line == 1);
  CHECK(rows[0].arguments.inputs.at("topic") == "a");
  CHECK(rows[0].arguments.inputs.count("answer") == 0);
  CHECK(rows[1].line == 3);
  CHECK(rows[1].arguments.inputs.at("topic") == "7");
  // --map topic=answer reads the input from another key; a map naming no input is an error.
  std::ofstream(path) << "{\"topic\": \"a\", \"answer\": \"b\"}\n";
  CHECK(exec::read_input_rows(path, workflow, {}, {{"topic", "answer"}})[0].arguments.inputs.at("topic") == "b");
  CHECK_THROWS_WITH_AS(exec::read_input_rows(path, workflow, {}, {{"topc", "answer"}}),
                       doctest::Contains("has no input `topc`"), InputError);

  auto error_of = [&](const std::string& text) {
    try {
      rows_of(text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of("{\"topic\": \"a\"}\n{\"topic\": \n").find(":2:") != std::string::npos);
  CHECK(error_of("[1, 2]\n").find("not an object") != std::string::npos);
  CHECK(error_of("{\"other\": 1}\n").find("has no `topic`, for input `topic`") != std::string::npos);
  CHECK(error_of("").find("no rows") != std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("input rows: a list input from a JSON array holds the row's strings exactly, whatever they contain") {
  // A row's array reaches the workflow as its JSON text (read_input_rows), read back as a list literal: JSON
  // writes control characters as \uXXXX, \b and \f, and may write any character so. Property: every string
  // comes back byte for byte (the strings themselves are the reference).
  const dsl::Workflow workflow = dsl::parse_workflow(
      "name: lists\ninputs: {items: list}\nmessages:\n  m: {text: 'x'}\nsteps:\n  - prefill: {as: p, text: '{{ items }}', parents: [m]}\n",
      "lists.yaml");
  const std::string path = (std::filesystem::temp_directory_path() / "choreo_list_rows_test.jsonl").string();
  std::mt19937 rng(2026);
  const uint32_t picks[] = {0x01, 0x08, 0x0C, 0x1B, 0x1F, '"', '\\', '/', '\'', 'a', ' ', 0x7F, 0xE9, 0x4E2D, 0xFFFD, 0x1F600};
  for (int round = 0; round < 50; ++round) {
    std::vector<std::string> strings(size_t(rng() % 4));
    for (std::string& s : strings)
      for (size_t n = rng() % 12; n > 0; --n) append_utf8(s, picks[rng() % std::size(picks)]);
    // Even rounds: a JSON array. Odd rounds: the array's JSON text as a string, written as Python's json.dumps
    // writes it (every non-ASCII character escaped, surrogate pairs past U+FFFF): a doubly encoded row.
    const nlohmann::json array = strings;
    const nlohmann::json row = {{"items", round % 2 == 0 ? array : nlohmann::json(array.dump(-1, ' ', true))}};
    std::ofstream(path) << row.dump() << "\n";
    const auto rows = exec::read_input_rows(path, workflow, {});
    REQUIRE(rows.size() == 1);
    const std::string& text = rows[0].arguments.inputs.at("items");
    CAPTURE(text);
    const dsl::expr::Value v = dsl::convert_argument(text, dsl::ValueType::List, "input `items`");
    REQUIRE(v.as_list().size() == strings.size());
    for (size_t i = 0; i < strings.size(); ++i) CHECK(v.as_list()[i].as_text() == strings[i]);
  }
  std::filesystem::remove(path);
}

// The Prisoner's Dilemma channel, with the words fixed so that only the encodings can carry the plan:
// Alice's plan is private; what Alice says is fixed text but is encoded over her plan; Bob reads what she said.
const char* kLeak = R"yaml(
name: leak
inputs: {plan: string}
sampling: {temperature: 0, max_tokens: 6}
agents:
  alice: {}
  bob: {}
messages:
  rules: {text: "Two friends played in the park."}
  bob_intro: {text: "Bob was happy.", private: bob}
steps:
  - prefill: {as: alice_plan, agent: alice, private: alice, text: "{{ plan }}", parents: [rules]}
  - prefill: {as: alice_says, agent: alice, text: "Alice said hello to Bob.", parents: [rules, alice_plan]}
  - decode: {as: bob_says, agent: bob, header: "Bob", parents: [rules, bob_intro, alice_says]}
output: "{{ bob_says }}"
)yaml";

std::vector<std::vector<float>> bob_logits(const std::string& plan, bool no_leak, int* reencoded = nullptr) {
  const dsl::Workflow workflow = dsl::parse_workflow(kLeak, "leak.yaml");
  kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(stories(), pool);
  exec::LeakGuard guard(engine);
  exec::BatchScheduler scheduler(engine, no_leak ? &guard : nullptr);
  exec::RunResult result;
  exec::RunHooks hooks;
  hooks.record_logits = [](const std::string& name) { return name == "bob_says"; };
  const auto errors = scheduler.run(1, 1, [&](size_t, exec::CallSink& sink) {
    result = exec::run_workflow(workflow, sink, {{{"plan", plan}}, {}}, hooks);
  });
  REQUIRE(!errors[0]);
  if (reencoded) *reencoded = guard.n_reencoded();
  return message(result, "bob_says").logits;
}

double max_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) worst = std::max(worst, double(std::fabs(a[i][j] - b[i][j])));
  return worst;
}

TEST_CASE("--no-leak: Alice's private plan cannot change Bob's logits, without it, it does") {
  const std::string plan_a = "Alice planned to share her toys.";
  const std::string plan_b = "She would run away with the big red ball and never come back.";
  // The leak is real: without the guard, Bob's first-step logits depend on Alice's private plan.
  const double leaked = max_difference(bob_logits(plan_a, false), bob_logits(plan_b, false));
  CHECK(leaked > 1e-3);
  // With the guard, they are bit-identical: nothing Bob's call reads depends on the plan.
  int reencoded = 0;
  const auto guarded_a = bob_logits(plan_a, true, &reencoded);
  CHECK(reencoded == 1);  // alice_says, re-encoded over [rules] without the plan
  CHECK(max_difference(guarded_a, bob_logits(plan_b, true)) == 0.0);
  // And the guard changes nothing when nothing leaks: Bob's own private intro stays visible to him.
  CHECK(max_difference(guarded_a, bob_logits(plan_a, true)) == 0.0);
}

TEST_CASE("LeakGuard taint: the agents whose private messages an encoding attended to, transitively") {
  kv::PagePool pool(stories().backend(), stories().kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(stories(), pool);
  const auto tokens = stories().vocab().tokenize("The cat sat.", false, true);
  auto prefill = [&](std::vector<kv::MessageId> parents, const std::string& agent, bool is_private) {
    runtime::PrefillRequest r;
    r.tokens = tokens;
    for (kv::MessageId p : parents) r.parents.push_back({p, std::nullopt, std::nullopt});
    r.agent = agent;
    r.visibility = is_private ? kv::Visibility::Private : kv::Visibility::Public;
    r.tokens.push_back(tokens[0] + kv::MessageId(parents.size()) + (is_private ? 7 : 0));  // distinct contents
    return engine.prefill(r).id;
  };
  const kv::MessageId secret_x = prefill({}, "x", true);
  const kv::MessageId by_x = prefill({secret_x}, "x", false);
  const kv::MessageId chain = prefill({by_x}, "z", false);
  const kv::MessageId plain = prefill({}, "y", false);
  exec::LeakGuard guard(engine);
  CHECK(guard.taint(secret_x).empty());  // a message is not tainted by itself
  CHECK(guard.taint(by_x) == std::set<std::string>{"x"});
  CHECK(guard.taint(chain) == std::set<std::string>{"x"});
  CHECK(guard.taint(plain).empty());
}

}  // namespace
}  // namespace choreo
