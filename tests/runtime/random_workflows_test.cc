// Issue 10, test 2: random well-formed workflows (fan-outs, nested `repeat`/`until`, `when`, `select`,
// private messages of declared agents, explicit offsets) run on stories260K. For each:
//  - the run succeeds: it compiles its plan first and checks every call against it while running
//    (exec/plan_follower.h), so a run that differs from its plan fails here as an internal error;
//  - the leaks `choreo check` predicts (dsl::analyze_flow over the plan) agree with the leaks observed in the
//    run, recomputed here by brute force from which messages each call actually attended to: a pair
//    (private message, reading call) leaks when the call's agent is not the owner and the private message
//    is a parent of one of its parents' encodings, transitively. Where the plan keeps a run-time choice open
//    (a `select` or `when` on generated text, an `until`), it over-approximates: observed ⊆ predicted, for
//    the calls that ran. A workflow without run-time choices must give exactly the predicted set.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dsl/flow.h"
#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"
#include "runtime/kv/page_pool.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using Pairs = std::set<std::pair<std::string, std::string>>;  // (private message, reading call)

struct Generated {
  std::string yaml;
  bool choices = false;  // some step only the run decides
};

/// A random workflow. Names are unique (no rebinding), so a name identifies one message of plan and run.
Generated generate(std::mt19937& rng, bool allow_choices) {
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  const std::vector<std::string> agents = {"ann", "ben", "cy"};
  Generated g;
  std::string y = "name: random\nagents: [ann, ben, cy]\nmessages:\n";
  std::vector<std::string> pool;  // names a parent entry may use (whole messages)
  y += "  intro: {text: \"Once upon a time\"}\n";
  pool.push_back("intro");
  for (size_t k = 0; k < agents.size(); ++k) {
    if (rng() % 3 == 0) continue;
    const std::string name = "secret_" + agents[k];
    y += fmt::format("  {}: {{text: \" {} had a secret\", private: {}}}\n", name, agents[k], agents[k]);
    pool.push_back(name);
  }
  y += "steps:\n";
  auto parents = [&](size_t max) {
    std::vector<std::string> out;
    const size_t n = 1 + pick(std::min(max, pool.size()));
    std::set<std::string> used;
    for (size_t i = 0; i < n; ++i) {
      const std::string& p = pool[pick(pool.size())];
      if (!used.insert(p).second) continue;
      out.push_back(rng() % 5 == 0 ? fmt::format("{{ref: \"{}\", at: {}}}", p, 20 + pick(40))
                                   : fmt::format("\"{}\"", p));
    }
    return out;
  };
  auto who = [&](std::string& line) {
    const size_t a = pick(agents.size() + 1);
    if (a == agents.size()) return;  // nobody's call
    line += ", agent: " + agents[a];
    if (rng() % 3 == 0) line += ", private: " + agents[a];
  };
  const size_t n_steps = 3 + pick(5);
  for (size_t s = 0; s < n_steps; ++s) {
    const std::string name = fmt::format("s{}", s);
    const size_t kind = pick(allow_choices ? 6 : 3);
    if (kind == 0 || kind == 1) {  // one call, decode or prefill
      std::string line = kind == 0 ? fmt::format("  - decode: {{as: {}, header: \" And\"", name)
                                   : fmt::format("  - prefill: {{as: {}, text: \" then\"", name);
      who(line);
      line += fmt::format(", parents: [{}]", fmt::join(parents(3), ", "));
      if (rng() % 6 == 0) line += fmt::format(", new_offset: {}", 80 + pick(40));
      y += line + "}\n";
      pool.push_back(name);
    } else if (kind == 2) {  // a fan-out; its branches read the pool and, sometimes, each other's inputs
      std::string line = fmt::format("  - decode: {{as: \"{}[i]\", for: \"i in range(2)\", header: \" So\"", name);
      who(line);
      line += fmt::format(", parents: [{}]", fmt::join(parents(2), ", "));
      y += line + "}\n";
      pool.push_back(fmt::format("{}[0]", name));
      pool.push_back(fmt::format("{}[1]", name));
    } else if (kind == 3) {  // a `when` on generated text
      g.choices = true;
      const std::string& guard = pool[pick(pool.size())];
      std::string line = fmt::format("  - decode: {{as: {}, header: \" Then\", when: \"len({}) > 10\"", name, guard);
      who(line);
      line += fmt::format(", parents: [{}]", fmt::join(parents(2), ", "));
      y += line + "}\n";
      // Not added to the pool: a later reader would fail when the run skips it.
    } else if (kind == 4) {  // a `select` between two messages by generated text
      g.choices = true;
      const std::string a = pool[pick(pool.size())], b = pool[pick(pool.size())];
      y += fmt::format("  - select: \"{} if len({}) > len({}) else {}\"\n    as: {}\n", a, a, b, b, name);
      pool.push_back(name);
    } else {  // nested repeats with an `until` on generated text; each iteration reads the one before
      g.choices = true;
      std::string inner = fmt::format("          - decode: {{as: \"{}[r][k]\", header: \" Next\"", name);
      who(inner);
      inner += fmt::format(", parents: [{}, \"{}[r][k-1] if k > 0 else intro\"]}}\n", fmt::join(parents(2), ", "), name);
      y += fmt::format("  - repeat: \"r in range(2)\"\n    until: \"len({}[r][1]) > 1000\"\n    steps:\n"
                       "      - repeat: \"k in range(2)\"\n        steps:\n{}",
                       name, inner);
      // The first iteration always runs: its messages may be read later.
      pool.push_back(fmt::format("{}[0][1]", name));
    }
  }
  g.yaml = y;
  return g;
}

/// The leaks and visibility violations a plan predicts, as (private message, reader) names.
Pairs predicted(const dsl::plan::Plan& plan) {
  const dsl::FlowReport report = dsl::analyze_flow(dsl::flow_messages(plan));
  Pairs out;
  for (const dsl::Leak& l : report.leaks) out.insert({plan.nodes[l.source].name, plan.nodes[l.reader].name});
  for (const dsl::VisibilityViolation& v : report.violations)
    out.insert({plan.nodes[v.message].name, plan.nodes[v.reader].name});
  return out;
}

/// The same observed in a run, by brute force: each message's encoding carries its private parents and what
/// they carry; a call by A reading a parent that is, or carries, a message private to B ≠ A leaks it.
Pairs observed(const exec::RunResult& r) {
  std::map<std::string, const exec::MessageRecord*> by_name;
  std::map<std::string, std::set<std::string>> carried;
  Pairs out;
  for (const exec::MessageRecord& m : r.messages) {
    std::set<std::string> mine;
    for (const std::string& parent : m.parents) {
      const exec::MessageRecord* p = by_name.at(parent);
      std::set<std::string> reach = carried[parent];
      if (p->is_private) reach.insert(parent);
      for (const std::string& s : reach) {
        mine.insert(s);
        if (m.kind != "message" && by_name.at(s)->agent != m.agent) out.insert({s, m.name});
      }
    }
    mine.erase(m.name);
    carried[m.name] = mine;
    by_name[m.name] = &m;
  }
  return out;
}

TEST_CASE("random workflows: run follows its plan, and the leaks check predicts are the leaks the run makes") {
  std::mt19937 rng(20261124);
  const model::Model& m = *testing::stories260k().model;
  int exact = 0, bounded = 0, leaks = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Generated g = generate(rng, trial % 2 == 1);
    CAPTURE(g.yaml);
    const dsl::Workflow workflow = dsl::parse_workflow(g.yaml, "random.yaml");
    const dsl::plan::Plan plan = dsl::plan::compile(workflow, {});
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(128) << 20);
    runtime::Engine engine(m, pool, trial % 7 == 3 ? runtime::Mode::Prefix : runtime::Mode::Choreo);
    exec::RunHooks hooks;
    hooks.exact_tokens = [&](const std::string& name) { return std::optional<int>(1 + int(name.size() % 3)); };
    const exec::RunResult r = exec::run_workflow(workflow, engine, {}, hooks);
    const Pairs seen = observed(r);
    Pairs expected;
    std::set<std::string> ran;
    for (const exec::MessageRecord& rec : r.messages) ran.insert(rec.name);
    for (const auto& pair : predicted(plan))
      if (ran.count(pair.second)) expected.insert(pair);
    leaks += int(seen.size());
    if (!g.choices) {
      ++exact;
      CHECK(seen == expected);
    } else {
      ++bounded;
      for (const auto& pair : seen) CHECK_MESSAGE(expected.count(pair), pair.first, " -> ", pair.second);
    }
  }
  MESSAGE(exact << " workflows compared exactly, " << bounded << " as a subset; " << leaks << " leaks observed");
  CHECK(leaks > 0);  // the generator does make leaks
}

}  // namespace
}  // namespace choreo
