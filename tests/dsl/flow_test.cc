// Information flow (dsl/flow): a private message reaches another agent exactly when a call of that agent
// reads an encoding that attended to it, directly or through other encodings. Checked on prisoners.yaml
// against the leaks derived by hand from the file, on variants and small chains, and on the incremental
// tracker `run --no-leak` uses: after re-encoding what it flags, no call reads anything foreign.

#include "dsl/flow.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"

namespace choreo::dsl {
namespace {

std::string read_workflow(const std::string& name) {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  const std::filesystem::path root = src ? std::filesystem::path(src) : std::filesystem::current_path();
  std::ifstream in(root / "workflows" / name);
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

plan::Plan compile_text(const std::string& yaml) { return plan::compile(parse_workflow(yaml, "w.yaml"), {}); }

/// Leaks as "source|parent|reader" strings, the form the hand derivation below is written in.
std::set<std::string> leak_triples(const plan::Plan& plan, const FlowReport& report) {
  std::set<std::string> out;
  for (const Leak& leak : report.leaks)
    out.insert(plan.nodes[leak.source].name + "|" + plan.nodes[leak.path.back()].name + "|" +
               plan.nodes[leak.reader].name);
  return out;
}

TEST_CASE("flow: prisoners.yaml leaks exactly the private messages derived by hand") {
  const plan::Plan plan = compile_text(read_workflow("prisoners.yaml"));
  const FlowReport report = analyze_flow(flow_messages(plan));
  // By hand from the file. Private: alice_intro, alice_plan (alice); bob_intro, bob_plan (bob). alice_says[r]
  // is encoded by alice with alice_intro and alice_plan as parents, so it carries both; bob_says[r] likewise
  // carries bob's two, and also alice's (it reads alice_says). alice_says[1] reads bob_says[0] and so
  // carries all four. Every read of such an encoding by the other prisoner is a leak of each foreign message:
  //   bob_says[0] (bob)   reads alice_says[0]                              -> 2
  //   alice_says[1] (alice) reads bob_says[0] (bob's two; alice's own are fine) -> 2
  //   bob_says[1] (bob)   reads alice_says[0], bob_says[0], alice_says[1]   -> 6
  //   decision[0] (alice) reads bob_says[0], alice_says[1], bob_says[1]     -> 6
  //   decision[1] (bob)   reads alice_says[0], bob_says[0], alice_says[1], bob_says[1] -> 8
  std::set<std::string> expected;
  auto add = [&](const std::string& owner, const std::string& parent, const std::string& reader) {
    expected.insert(owner + "_intro|" + parent + "|" + reader);
    expected.insert(owner + "_plan|" + parent + "|" + reader);
  };
  add("alice", "alice_says[0]", "bob_says[0]");
  add("bob", "bob_says[0]", "alice_says[1]");
  for (const char* parent : {"alice_says[0]", "bob_says[0]", "alice_says[1]"})
    add("alice", parent, "bob_says[1]");
  for (const char* parent : {"bob_says[0]", "alice_says[1]", "bob_says[1]"})
    add("bob", parent, "decision[0]");
  for (const char* parent : {"alice_says[0]", "bob_says[0]", "alice_says[1]", "bob_says[1]"})
    add("alice", parent, "decision[1]");
  CHECK(report.leaks.size() == 24);
  CHECK(leak_triples(plan, report) == expected);
  CHECK(report.violations.empty());

  // Each path is a real chain of encodings: every step is a parent of the next, the last is the read parent.
  for (const Leak& leak : report.leaks) {
    REQUIRE(leak.path.front() == leak.source);
    for (size_t k = 1; k < leak.path.size(); ++k) {
      bool is_parent = false;
      for (const plan::Edge& e : plan.nodes[leak.path[k]].parents) is_parent |= e.parent == leak.path[k - 1];
      CHECK(is_parent);
    }
    bool read = false;
    for (const plan::Edge& e : plan.nodes[leak.reader].parents) read |= e.parent == leak.path.back();
    CHECK(read);
  }
  // The shortest chain from alice_plan into bob_says[0], read by bob in bob_says[1]: via alice_says[0].
  bool found = false;
  for (const Leak& leak : report.leaks) {
    std::vector<std::string> names;
    for (size_t m : leak.path) names.push_back(plan.nodes[m].name);
    if (names.back() == "bob_says[0]" && plan.nodes[leak.reader].name == "bob_says[1]" &&
        names[0] == "alice_plan") {
      CHECK(names == std::vector<std::string>{"alice_plan", "alice_says[0]", "bob_says[0]"});
      CHECK(plan.nodes[leak.reader].where.line == 36);  // the `decode:` of bob_says in prisoners.yaml
      found = true;
    }
  }
  CHECK(found);
}

TEST_CASE("flow: prisoners without private messages has no leaks") {
  std::string yaml = read_workflow("prisoners.yaml");
  for (const char* marker : {", private: alice", ", private: bob"}) {
    for (size_t at = yaml.find(marker); at != std::string::npos; at = yaml.find(marker))
      yaml.erase(at, std::string(marker).size());
  }
  REQUIRE(yaml.find("private:") == std::string::npos);
  const FlowReport report = analyze_flow(flow_messages(compile_text(yaml)));
  CHECK(report.leaks.empty());
  CHECK(report.violations.empty());
}

const std::string kAgents =
    "name: t\n"
    "agents: {x: {}, y: {}}\n"
    "messages:\n"
    "  secret: {role: user, text: s, private: x}\n"
    "  open: {role: user, text: o}\n"
    "steps:\n";

TEST_CASE("flow: a chain private-to-x -> encoded by x -> read by y is a leak with that path") {
  const plan::Plan plan =
      compile_text(kAgents +
                   "  - decode: {as: b, agent: x, role: assistant, parents: [secret, open]}\n"
                   "  - decode: {as: c, agent: x, role: assistant, parents: [b]}\n"
                   "  - decode: {as: d, agent: y, role: assistant, parents: [open, c]}\n");
  const FlowReport report = analyze_flow(flow_messages(plan));
  REQUIRE(report.leaks.size() == 1);
  const Leak& leak = report.leaks[0];
  std::vector<std::string> path;
  for (size_t m : leak.path) path.push_back(plan.nodes[m].name);
  CHECK(path == std::vector<std::string>{"secret", "b", "c"});
  CHECK(plan.nodes[leak.reader].name == "d");
  CHECK(plan.nodes[leak.reader].where.line == 9);
  CHECK(report.violations.empty());
}

TEST_CASE("flow: reading your own private message, directly or through encodings, is fine") {
  const plan::Plan plan =
      compile_text(kAgents +
                   "  - decode: {as: b, agent: x, role: assistant, parents: [secret]}\n"
                   "  - decode: {as: c, agent: x, role: assistant, parents: [secret, b]}\n");
  const FlowReport report = analyze_flow(flow_messages(plan));
  CHECK(report.leaks.empty());
  CHECK(report.violations.empty());
}

TEST_CASE("flow: reading another agent's private message directly is a visibility violation, not a leak") {
  const plan::Plan plan =
      compile_text(kAgents +
                   "  - decode: {as: b, agent: y, role: assistant, parents: [open, secret]}\n"
                   "  - decode: {as: c, role: assistant, parents: [b]}\n");
  const FlowReport report = analyze_flow(flow_messages(plan));
  REQUIRE(report.violations.size() == 1);
  CHECK(plan.nodes[report.violations[0].message].name == "secret");
  CHECK(plan.nodes[report.violations[0].reader].name == "b");
  // c has no agent, so it owns nothing: reading b (which carries x's secret) is a leak.
  REQUIRE(report.leaks.size() == 1);
  CHECK(plan.nodes[report.leaks[0].reader].name == "c");
}

TEST_CASE("flow: a private call's output is private to its owner") {
  const plan::Plan plan = compile_text(kAgents +
                                       "  - decode: {as: p, private: x, role: assistant, parents: [open]}\n"
                                       "  - decode: {as: q, agent: y, role: assistant, parents: [p]}\n");
  CHECK(plan.nodes.back().agent == "y");
  const FlowReport report = analyze_flow(flow_messages(plan));
  REQUIRE(report.violations.size() == 1);
  CHECK(plan.nodes[report.violations[0].message].name == "p");
  CHECK(plan.nodes[report.violations[0].message].agent == "x");  // a private call without agent: its owner
}

TEST_CASE("flow: the tracker flags what analyze_flow flags, and re-encoding it leaves nothing foreign") {
  const plan::Plan plan = compile_text(read_workflow("prisoners.yaml"));
  const std::vector<FlowMessage> messages = flow_messages(plan);
  const FlowReport report = analyze_flow(messages);
  std::set<std::pair<size_t, size_t>> flagged;  // (reader, parent) pairs of the plan's leaks
  for (const Leak& leak : report.leaks) flagged.insert({leak.reader, leak.path.back()});

  // 1. Without re-encoding, the tracker's answer per call equals the whole-plan analysis.
  FlowTracker plain;
  for (size_t i = 0; i < messages.size(); ++i) {
    std::vector<std::string> parents;
    for (size_t p : messages[i].parents) parents.push_back(messages[p].name);
    std::set<std::pair<size_t, size_t>> here;
    for (const std::string& name : plain.leaking_parents(messages[i].agent, parents))
      for (size_t p : messages[i].parents)
        if (messages[p].name == name) here.insert({i, p});
    std::set<std::pair<size_t, size_t>> expected;
    for (const auto& pair : flagged)
      if (pair.first == i) expected.insert(pair);
    CHECK(here == expected);
    plain.add(messages[i].name, messages[i].agent, messages[i].private_to, parents);
  }
  CHECK(plain.foreign_private("bob", "alice_says[0]") ==
        std::vector<std::string>{"alice_intro", "alice_plan"});
  CHECK(plain.foreign_private("alice", "alice_says[0]").empty());
  CHECK(plain.parents_of("alice_says[0]") ==
        std::vector<std::string>{"rules", "alice_intro", "alice_plan", "talk_prompt"});
  CHECK_THROWS_AS(plain.leaking_parents("bob", std::vector<std::string>{"nonexistent"}),
                  std::invalid_argument);

  // 2. `run --no-leak`: each call reads clean() of its parents; afterwards nothing it reads carries another
  //    agent's private message, and the fresh encodings are the ones derived by hand from the rule (drop
  //    parents private to others, clean the rest the same way).
  FlowTracker guarded;
  std::set<std::string> fresh;
  for (const FlowMessage& m : messages) {
    std::vector<std::string> parents;
    for (size_t p : m.parents) {
      parents.push_back(guarded.clean(messages[p].name, m.agent));
      if (parents.back() != messages[p].name) fresh.insert(parents.back());
    }
    CHECK(guarded.leaking_parents(m.agent, parents).empty());
    guarded.add(m.name, m.agent, m.private_to, parents);
  }
  CHECK(fresh == std::set<std::string>{"alice_says[0] for bob", "bob_says[0] for alice",
                                       "alice_says[1] for bob", "bob_says[1] for alice"});
  CHECK(guarded.parents_of("alice_says[0] for bob") == std::vector<std::string>{"rules", "talk_prompt"});
  // bob_says[0] as run under the guard read the fresh alice_says[0]; alice's copy keeps that, drops bob's
  // own.
  CHECK(guarded.parents_of("bob_says[0] for alice") ==
        std::vector<std::string>{"rules", "alice_says[0] for bob", "talk_prompt"});
  CHECK(guarded.parents_of("alice_says[1] for bob") ==
        std::vector<std::string>{"rules", "alice_says[0] for bob", "bob_says[0] for alice", "talk_prompt"});
  CHECK(guarded.clean("rules", "bob") == "rules");
}

}  // namespace
}  // namespace choreo::dsl
