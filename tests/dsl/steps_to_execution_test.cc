// Steps-to-execution (dsl/plan/steps_to_execution.h), issue 10 test 3: values worked out by hand from the
// workflows' steps, checked at three points of each workflow (before its first step, in the middle, near the
// end), once on the plan's StepClock and once on what a real run (stories260K) recorded after each of its
// steps (RunResult::steps, what `--trace` draws).
//
// The rule, restated for working by hand: steps run in plan order, so a future step b is
//   steps(b) = the number of steps between now and b that always run (the run may skip a conditional one:
//              the minimum over a conditional branch), the last of its parents' steps included (a join
//              waits for the last of its parents: the maximum);
// an agent's value is that of its next step; a message's that of the next step reading it; "-" = never.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "dsl/plan/plan.h"
#include "dsl/plan/steps_to_execution.h"
#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"
#include "runtime/kv/page_pool.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using Values = std::map<std::string, std::optional<size_t>>;
constexpr std::optional<size_t> kNever = std::nullopt;

dsl::Workflow load(const std::string& relative) {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  const fs::path path = fs::path(src ? src : ".") / relative;
  std::ifstream in(testing::require_file(path));
  std::stringstream text;
  text << in.rdbuf();
  return dsl::parse_workflow(text.str(), path.string());
}

/// A point of the run: after plan step `completed` (none: before the first), the expected agent values.
struct Point {
  std::optional<size_t> completed;
  Values agents;
};

Values agent_values(const dsl::plan::StepClock& clock) {
  Values out;
  for (const std::string& a : clock.agents()) out[a] = clock.for_agent(a);
  return out;
}

/// Checks the points on the plan's clock (completing every step in order) and on a real run's samples.
void check_points(const std::string& file, const dsl::plan::Arguments& arguments, const std::vector<Point>& points,
                  const std::map<std::string, std::optional<size_t>>& messages_at_start = {}) {
  CAPTURE(file);
  const dsl::Workflow workflow = load(file);
  const dsl::plan::Plan plan = dsl::plan::compile(workflow, arguments);
  {
    dsl::plan::StepClock clock(plan);
    for (const auto& [name, want] : messages_at_start) {
      auto it = std::find_if(plan.nodes.begin(), plan.nodes.end(), [&](auto& n) { return n.name == name; });
      REQUIRE(it != plan.nodes.end());
      CHECK_MESSAGE(clock.for_message(size_t(it - plan.nodes.begin())) == want, "message ", name);
    }
    size_t done = 0;
    for (const Point& p : points) {
      if (p.completed)
        for (; done <= *p.completed; ++done) clock.complete(done);
      CAPTURE(p.completed.value_or(SIZE_MAX));
      CHECK(agent_values(clock) == p.agents);
    }
  }
  // The same points as a run saw them.
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  runtime::Engine engine(m, pool);
  exec::RunHooks hooks;
  hooks.exact_tokens = [](const std::string&) { return std::optional<int>(2); };
  const exec::RunResult r = exec::run_workflow(workflow, engine, arguments, hooks);
  REQUIRE(r.steps.size() == plan.batches.size() + 1);  // no conditional steps in these runs: all ran
  CHECK(engine.step_oracles().size() == 0);             // the run removed its oracle
  for (const Point& p : points) {
    auto it = std::find_if(r.steps.begin(), r.steps.end(), [&](const exec::StepSample& s) { return s.completed == p.completed; });
    REQUIRE(it != r.steps.end());
    Values got(it->agents.begin(), it->agents.end());
    CAPTURE(p.completed.value_or(SIZE_MAX));
    CHECK(got == p.agents);
  }
}

TEST_CASE("steps to execution, by hand: madpar") {
  // rounds=2: step 0 = the declared messages (start, debate), step 1 = answer[0][0..2], step 2 = answer[1][..].
  // Every call's agent is its `as` base name, `answer`. Before step 0 runs, `answer` is one step away (step 0
  // always runs first); after step 0 it runs next (0); after step 1 it runs next again (round 1); after
  // step 2 never again. `start` is read at step 1 (1 away at the start); `debate` and round 0's answers at
  // step 2 (2 away); round 1's answers by nothing.
  check_points("workflows/madpar.yaml", {{{"problem", "What is 2 + 2?"}}, {{"rounds", "2"}}},
               {{std::nullopt, {{"answer", 1}}}, {1, {{"answer", 0}}}, {2, {{"answer", kNever}}}},
               {{"start", 1}, {"debate", 2}, {"answer[0][1]", 2}, {"answer[1][0]", kNever}});
}

TEST_CASE("steps to execution, by hand: tot") {
  // branches=2, voters=2: step 0 messages, 1 cot[0..1], 2 vote[0..1], 3 final (over `chosen`, a run-time
  // choice among cot[*]). At the start cot/vote/final are 1/2/3 away; after step 1, cot never runs again,
  // vote is next and final one away; after step 2 only final remains, next. cot[0] is read by the votes
  // (step 2) and maybe by final (step 3): the minimum, 2.
  check_points("workflows/tot.yaml", {{{"problem", "What is 1 + 3 + 5?"}}, {{"branches", "2"}, {"voters", "2"}}},
               {{std::nullopt, {{"cot", 1}, {"vote", 2}, {"final", 3}}},
                {1, {{"cot", kNever}, {"vote", 0}, {"final", 1}}},
                {2, {{"cot", kNever}, {"vote", kNever}, {"final", 0}}}},
               {{"cot[0]", 2}, {"ballot", 2}, {"finish", 3}, {"vote[1]", kNever}});
}

TEST_CASE("steps to execution, by hand: bsm") {
  // step 0 messages, 1 plan, 2 part[0..1] (prefills), 3 solution[0..1], 4 merged. A chain: each agent is
  // its step's distance away. merge_prompt is first read by merged (4 away at the start); plan by the parts.
  check_points("workflows/bsm.yaml", {{{"task", "Write about the sea and the hills."}}, {}},
               {{std::nullopt, {{"plan", 1}, {"part", 2}, {"solution", 3}, {"merged", 4}}},
                {2, {{"plan", kNever}, {"part", kNever}, {"solution", 0}, {"merged", 1}}},
                {3, {{"plan", kNever}, {"part", kNever}, {"solution", kNever}, {"merged", 0}}}},
               {{"merge_prompt", 4}, {"plan", 2}, {"part[1]", 3}});
}

TEST_CASE("steps to execution, by hand: prisoners") {
  // rounds=2: step 0 messages, 1 alice_plan, 2 bob_plan, 3 alice_says[0], 4 bob_says[0], 5 alice_says[1],
  // 6 bob_says[1], 7 decision[0..1] (alice and bob together). Alice and Bob alternate: after step 3 Bob is
  // next (0) and Alice one away; after step 6 both decide next (0); after step 7 neither runs again.
  // decide_prompt is first read at step 7 (7 away at the start); bob_plan at step 4 (Bob's first turn).
  check_points("workflows/prisoners.yaml", {},
               {{std::nullopt, {{"alice", 1}, {"bob", 2}}},
                {3, {{"alice", 1}, {"bob", 0}}},
                {6, {{"alice", 0}, {"bob", 0}}},
                {7, {{"alice", kNever}, {"bob", kNever}}}},
               {{"decide_prompt", 7}, {"bob_plan", 4}, {"alice_says[0]", 4}});
}

TEST_CASE("steps to execution, by hand: steps the run may skip count as skipped (the minimum)") {
  // maditer, rounds=3: step 0 messages; 1 pro[0], 2 con[0], 3 verdict[0]; steps 4..9 are rounds 1 and 2,
  // conditional (the `until` reads the verdict). After step 1: con is next (0), verdict after it (1), and the
  // affirmative's next turn (step 4) is 2 away: steps 2 and 3 always run. After step 3 every later step
  // may be skipped, so each agent may be next: all 0. After step 7 the affirmative never runs again.
  const dsl::Workflow workflow = load("workflows/maditer.yaml");
  const dsl::plan::Plan plan =
      dsl::plan::compile(workflow, {{{"question", "Is zero even?"}}, {{"rounds", "3"}}});
  dsl::plan::StepClock clock(plan);
  CHECK(agent_values(clock) == Values{{"affirmative", 1}, {"negative", 2}, {"moderator", 3}});
  clock.complete(1);  // step 0 resolved with it
  CHECK(agent_values(clock) == Values{{"affirmative", 2}, {"negative", 0}, {"moderator", 1}});
  clock.complete(3);  // step 2 too
  CHECK(agent_values(clock) == Values{{"affirmative", 0}, {"negative", 0}, {"moderator", 0}});
  clock.complete(7);  // steps 4..6 skipped or run: the same
  CHECK(agent_values(clock) == Values{{"affirmative", kNever}, {"negative", 0}, {"moderator", 0}});
}

}  // namespace
}  // namespace choreo

namespace choreo {
namespace {

TEST_CASE("agents: `private: true` makes an agent's calls private to it, did-you-mean for a misspelt agent") {
  const std::string yaml = R"yaml(name: a
agents:
  alice: {description: "keeps her notes", private: true}
  bob: {private: false}
messages:
  m: {text: "Once upon a time"}
steps:
  - decode: {as: x, agent: alice, parents: [m], header: " a"}
  - decode: {as: y, agent: bob, parents: [m], header: " b"}
  - decode: {as: z, agent: bob, private: bob, parents: [m], header: " c"}
  - decode: {as: w, parents: [m], header: " d"}
)yaml";
  const dsl::plan::Plan plan = dsl::plan::compile(dsl::parse_workflow(yaml, "a.yaml"), {});
  std::map<std::string, std::string> owner;
  for (const dsl::plan::Node& n : plan.nodes) owner[n.name] = n.private_to;
  CHECK(owner["x"] == "alice");
  CHECK(owner["y"] == "");
  CHECK(owner["z"] == "bob");
  CHECK(owner["w"] == "");
  // The run makes the same message private (the plan follower would stop it otherwise).
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(m, pool);
  const exec::RunResult r = exec::run_workflow(dsl::parse_workflow(yaml, "a.yaml"), engine, {});
  for (const exec::MessageRecord& rec : r.messages)
    if (rec.name == "x") CHECK(rec.is_private);

  std::string misspelt = yaml;
  misspelt.replace(misspelt.find("agent: bob, parents"), 10, "agent: bbo");
  try {
    dsl::parse_workflow(misspelt, "a.yaml");
    FAIL("a misspelt agent was accepted");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("unknown agent `bbo`") != std::string::npos);
    CHECK(e.render().find("did you mean 'bob'") != std::string::npos);
  }
  CHECK_THROWS_AS(dsl::parse_workflow(R"yaml(name: a
agents:
  alice: {private: maybe}
steps: []
)yaml", "a.yaml"), InputError);
}

}  // namespace
}  // namespace choreo
