// Compiling workflows to plans without a model (dsl/plan): expansion counts and batch sizes equal the hand
// count from each YAML, parents resolve to the messages the file names, run-time choices stay open (marked
// conditional or as selections), counts that need an unknown input are errors that say which --input to pass,
// the "reads generated text" analysis decides what can be evaluated early, and the agent step graph and its
// DOT text contain every agent and dependency.

#include "dsl/plan/plan.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "dsl/expr/parser.h"
#include "dsl/plan/dependence.h"
#include "dsl/plan/dot.h"
#include "dsl/plan/step_graph.h"
#include "dsl/workflow_parser.h"
#include "common/error.h"

namespace choreo::dsl::plan {
namespace {

std::filesystem::path source_dir() {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  return src ? std::filesystem::path(src) : std::filesystem::current_path();
}

Plan compile_file(const std::string& name, const Arguments& arguments = {}) {
  return compile(load_workflow((source_dir() / "workflows" / name).string()), arguments);
}

Plan compile_text(const std::string& yaml, const Arguments& arguments = {}) {
  return compile(parse_workflow(yaml, "w.yaml"), arguments);
}

InputError compile_error(const std::string& yaml, const Arguments& arguments = {}) {
  try {
    compile_text(yaml, arguments);
  } catch (const InputError& e) {
    return e;
  }
  FAIL("expected an InputError for:\n", yaml);
  return InputError("unreachable");
}

std::vector<size_t> batch_sizes(const Plan& plan) {
  std::vector<size_t> out;
  for (const Batch& b : plan.batches) out.push_back(b.nodes.size());
  return out;
}

const Node& node(const Plan& plan, const std::string& name) {
  for (const Node& n : plan.nodes)
    if (n.name == name) return n;
  FAIL("no node ", name);
  return plan.nodes.front();
}

std::vector<std::string> parent_names(const Plan& plan, const std::string& name) {
  std::vector<std::string> out;
  for (const Edge& e : node(plan, name).parents) out.push_back(plan.nodes[e.parent].name);
  return out;
}

TEST_CASE("plan: madpar expands to agents x rounds decodes, one batch per round") {
  // madpar.yaml: 2 messages; round 0 is a 3-way fan-out; `repeat r in range(1, 3)` adds 2 more rounds.
  const Plan plan = compile_file("madpar.yaml");
  CHECK(plan.nodes.size() == 2 + 3 * 3);
  CHECK(plan.call_count() == 9);
  CHECK(batch_sizes(plan) == std::vector<size_t>{2, 3, 3, 3});
  CHECK(plan.batches[0].kind == NodeKind::Message);
  for (size_t b = 1; b < 4; ++b) CHECK(plan.batches[b].kind == NodeKind::Decode);
  // Agent 1 in round 2 reads the start, the *other* agents' round-1 answers, and the debate prompt.
  CHECK(parent_names(plan, "answer[2][1]") ==
        std::vector<std::string>{"start", "answer[1][0]", "answer[1][2]", "debate"});
  CHECK(parent_names(plan, "answer[0][2]") == std::vector<std::string>{"start"});
  // Round r = 2 is the loop's second iteration (index 1); round 0 is outside the loop.
  REQUIRE(node(plan, "answer[2][0]").iterations.size() == 1);
  CHECK(node(plan, "answer[2][0]").iterations[0].index == 1);
  CHECK(node(plan, "answer[0][0]").iterations.empty());
  REQUIRE(plan.loops.size() == 1);
  CHECK(plan.loops[0].iterations == 2);
  CHECK_FALSE(plan.loops[0].may_stop_early);
  for (const Node& n : plan.nodes) CHECK_FALSE(n.conditional);

  // Params override the defaults: 2 agents x 5 rounds.
  const Plan bigger = compile_file("madpar.yaml", {{}, {{"agents", "2"}, {"rounds", "5"}}});
  CHECK(bigger.call_count() == 10);
  CHECK(batch_sizes(bigger) == std::vector<size_t>{2, 2, 2, 2, 2, 2});
  CHECK(parent_names(bigger, "answer[4][0]") == std::vector<std::string>{"start", "answer[3][1]", "debate"});
}

TEST_CASE("plan: tot has 8 branches, 4 voters and a final answer that may read any branch") {
  const Plan plan = compile_file("tot.yaml");
  CHECK(batch_sizes(plan) == std::vector<size_t>{4, 8, 4, 1});
  CHECK(plan.call_count() == 13);
  // Each voter reads system, task, all 8 branches and the ballot.
  CHECK(node(plan, "vote[3]").parents.size() == 2 + 8 + 1);
  // `best` comes from the votes' generated text, so `chosen` = cot[best] is any of the 8 branches.
  const Node& final = node(plan, "final");
  std::vector<std::string> expected{"system", "task"};
  for (int b = 0; b < 8; ++b) expected.push_back("cot[" + std::to_string(b) + "]");
  expected.push_back("finish");
  CHECK(parent_names(plan, "final") == expected);
  for (const Edge& e : final.parents) CHECK(e.selection == (plan.nodes[e.parent].base == "cot"));
  CHECK_FALSE(final.conditional);
}

TEST_CASE("plan: bsm is plan, two parallel prefills, two parallel solves, merge") {
  const Plan plan = compile_file("bsm.yaml");
  CHECK(batch_sizes(plan) == std::vector<size_t>{4, 1, 2, 2, 1});
  const std::vector<NodeKind> kinds{NodeKind::Message, NodeKind::Decode, NodeKind::Prefill, NodeKind::Decode,
                                    NodeKind::Decode};
  for (size_t b = 0; b < kinds.size(); ++b) CHECK(plan.batches[b].kind == kinds[b]);
  CHECK(parent_names(plan, "merged") ==
        std::vector<std::string>{"system", "request", "solution[0]", "solution[1]", "merge_prompt"});
  CHECK(parent_names(plan, "solution[1]") ==
        std::vector<std::string>{"system", "request", "branch_prompt", "plan", "part[1]"});
  // Prefill text is rendered when it needs no unknown input; the request needs `task`.
  CHECK(node(plan, "part[1]").text == std::optional<std::string>("Solve only Part 2 of the plan above."));
  CHECK_FALSE(node(plan, "request").text.has_value());
  const Plan given = compile_file("bsm.yaml", {{{"task", "write a haiku"}}, {}});
  CHECK(node(given, "request").text == std::optional<std::string>("Task: write a haiku"));
}

TEST_CASE("plan: maditer keeps all rounds, those after the first `until` check are conditional") {
  const Plan plan = compile_file("maditer.yaml");
  CHECK(plan.call_count() == 3 * 4);
  CHECK(batch_sizes(plan) == std::vector<size_t>{4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  REQUIRE(plan.loops.size() == 1);
  CHECK(plan.loops[0].may_stop_early);
  CHECK_FALSE(node(plan, "verdict[0]").conditional);
  CHECK(node(plan, "pro[1]").conditional);
  CHECK(node(plan, "verdict[3]").conditional);
  // The negative side in round 1 reads round 0 (pro, con, verdict), the turn prompts and this round's pro.
  CHECK(parent_names(plan, "con[1]") == std::vector<std::string>{"topic", "pro[0]", "con[0]", "verdict[0]",
                                                                 "affirmative_turn", "pro[1]",
                                                                 "negative_turn"});
}

const std::string kHead =
    "name: t\n"
    "inputs: {n: int}\n"
    "params: {k: 3}\n"
    "messages:\n"
    "  start: {role: user, text: hi}\n";

TEST_CASE("plan: conditions known before the run are evaluated, others kept open") {
  // A static `until` stops the loop exactly: r = 0, 1 run, r = 2 never does.
  const Plan stops = compile_text(kHead +
                                  "steps:\n"
                                  "  - repeat: \"r in range(k)\"\n"
                                  "    until: \"r >= 1\"\n"
                                  "    steps:\n"
                                  "      - decode: {as: \"a[r]\", role: assistant, parents: [start]}\n");
  CHECK(stops.call_count() == 2);
  CHECK_FALSE(stops.loops[0].may_stop_early);
  for (const Node& n : stops.nodes) CHECK_FALSE(n.conditional);

  // A static `when` leaves branch 1 out of the batch; one that reads generated text keeps every branch.
  const Plan skips =
      compile_text(kHead +
                   "steps:\n"
                   "  - decode: {as: \"a[i]\", for: \"i in range(k)\", when: \"i != 1\", role: assistant, "
                   "parents: [start]}\n"
                   "  - decode: {as: \"b[i]\", for: \"i in range(k)\", when: \"'yes' in a[0]\", "
                   "role: assistant, parents: [start, \"a[0]\"]}\n");
  CHECK(batch_sizes(skips) == std::vector<size_t>{1, 2, 3});
  CHECK(node(skips, "a[2]").name == "a[2]");
  CHECK_FALSE(node(skips, "a[2]").conditional);
  CHECK(node(skips, "b[0]").conditional);
  CHECK(skips.batches[2].conditional);
}

TEST_CASE("plan: a let known before the run selects exactly, one from generated text selects any candidate") {
  const std::string body =
      kHead +
      "steps:\n"
      "  - decode: {as: \"a[i]\", for: \"i in range(k)\", role: assistant, parents: [start]}\n"
      "  - let: {pick: \"k - 2\", best: \"int(boxed(a[0]))\"}\n"
      "  - select: \"a[pick]\"\n"
      "    as: exact\n"
      "  - select: \"a[best]\"\n"
      "    as: chosen\n"
      "  - decode: {as: x, role: assistant, parents: [exact]}\n"
      "  - decode: {as: y, role: assistant, parents: [start, chosen]}\n";
  const Plan plan = compile_text(body);
  CHECK(parent_names(plan, "x") == std::vector<std::string>{"a[1]"});
  CHECK_FALSE(node(plan, "x").parents[0].selection);
  CHECK(parent_names(plan, "y") == std::vector<std::string>{"start", "a[0]", "a[1]", "a[2]"});
  CHECK_FALSE(node(plan, "y").parents[0].selection);
  CHECK(node(plan, "y").parents[1].selection);
}

TEST_CASE("plan: counts that depend on an unknown input or on generated text are errors") {
  const std::string fan =
      kHead +
      "steps:\n"
      "  - decode: {as: \"a[i]\", for: \"i in range(n)\", role: assistant, parents: [start]}\n";
  InputError e = compile_error(fan);
  INFO(e.render());
  CHECK(e.message().find("input `n`") != std::string::npos);
  CHECK(e.hint().find("--input n=") != std::string::npos);
  CHECK(e.where().line == 7);
  CHECK(e.where().col == 37);  // the `range(n)` after `i in `
  // Given the input, the fan-out expands.
  CHECK(compile_text(fan, {{{"n", "4"}}, {}}).call_count() == 4);

  const std::string generated =
      kHead +
      "steps:\n"
      "  - decode: {as: x, role: assistant, parents: [start]}\n"
      "  - decode: {as: \"a[i]\", for: \"i in range(len(x))\", role: assistant, parents: "
      "[start]}\n";
  InputError g = compile_error(generated);
  CHECK(g.message().find("generated text") != std::string::npos);
  CHECK(g.where().line == 8);

  // A parent that is not a message, and an index out of range, fail like the interpreter would.
  InputError not_message =
      compile_error(kHead +
                    "steps:\n"
                    "  - decode: {as: x, role: assistant, parents: [start, \"range(2)\"]}\n");
  CHECK(not_message.message().find("not a message") != std::string::npos);
  CHECK(not_message.where().line == 7);
  InputError out_of_range =
      compile_error(kHead +
                    "steps:\n"
                    "  - decode: {as: \"a[i]\", for: \"i in range(2)\", role: assistant, parents: [start]}\n"
                    "  - decode: {as: x, role: assistant, parents: [\"a[5]\"]}\n");
  CHECK(out_of_range.where().line == 8);

  // Unknown and mistyped command-line values.
  CHECK(compile_error(fan, {{{"m", "1"}}, {}}).message().find("unknown input `m`") != std::string::npos);
  CHECK(compile_error(fan, {{{"n", "2"}}, {{"kk", "1"}}}).message().find("unknown param `kk`") !=
        std::string::npos);
  CHECK(compile_error(fan, {{{"n", "two"}}, {}}).message().find("input `n` must be an int") !=
        std::string::npos);
}

Shape shape_for(std::string_view name) {
  // `cot`: list of decodes (generated text); `ask`: a declared message with known text; `r`, `best`: ints.
  if (name == "cot") return {0b10, 0b10};
  if (name == "grid") return {0b100, 0b100};
  if (name == "ask") return {0b1, 0};
  return {};
}

Dependence dependence_of(const std::string& text) {
  return analyze(expr::parse_expression(text, SourceLocation{"e", 1, 1}), shape_for);
}

TEST_CASE("plan: moving messages does not read their text, comparing or converting them does") {
  CHECK_FALSE(dependence_of("cot[best]").reads_generated_text);
  CHECK(dependence_of("cot[best]").result.messages == 0b1);
  CHECK_FALSE(dependence_of("[cot[0], cot[1]]").reads_generated_text);
  CHECK_FALSE(dependence_of("m for t in range(r) for m in [cot[t], grid[t][0]]").reads_generated_text);
  CHECK_FALSE(dependence_of("grid[r - 1][j] for j in range(3) if j != r").reads_generated_text);
  CHECK_FALSE(dependence_of("cot + cot").reads_generated_text);
  CHECK_FALSE(dependence_of("len(cot) > 2").reads_generated_text);
  CHECK_FALSE(dependence_of("'x' in ask").reads_generated_text);  // known text
  CHECK(dependence_of("'WINNER' in cot[r]").reads_generated_text);
  CHECK(dependence_of("len(cot[0])").reads_generated_text);
  CHECK(dependence_of("int(majority([boxed(cot[v]) for v in range(4)]))").reads_generated_text);
  CHECK(dependence_of("int(majority([boxed(cot[v]) for v in range(4)]))").result.messages == 0);
  CHECK(dependence_of("sorted(cot)").reads_generated_text);
  CHECK(dependence_of("cot[0] + '!'").reads_generated_text);
  CHECK(dependence_of("cot[0] == cot[1]").reads_generated_text);
  CHECK(dependence_of("c for c in cot[0]").reads_generated_text);
  CHECK(dependence_of("grid[0] if cot[0] else grid[1]").reads_generated_text);
  CHECK(dependence_of("grid[0][0][1:]").reads_generated_text);
  CHECK_FALSE(dependence_of("grid[0][1:]").reads_generated_text);
}

TEST_CASE("plan: prisoners' agent step graph has both agents, their steps and every dependency") {
  const Plan plan = compile_file("prisoners.yaml");
  const StepGraph graph = agent_step_graph(plan);
  CHECK(graph.agents == std::vector<std::string>{"alice", "bob"});
  // Step 0 is the messages; then alice_plan, bob_plan, alice_says[0], bob_says[0], alice_says[1],
  // bob_says[1], and both decisions in one batch.
  std::vector<size_t> alice, bob;
  for (const AgentStep& s : graph.steps.at("alice")) alice.push_back(s.step);
  for (const AgentStep& s : graph.steps.at("bob")) bob.push_back(s.step);
  CHECK(alice == std::vector<size_t>{1, 3, 5, 7});
  CHECK(bob == std::vector<size_t>{2, 4, 6, 7});
  REQUIRE(graph.edges.size() == 4);
  std::map<std::pair<std::string, std::string>, AgentEdge> by_pair;
  for (const AgentEdge& e : graph.edges) by_pair[{e.from, e.to}] = e;
  // bob reads alice_says[0] in bob_says[0], alice_says[0..1] in bob_says[1] and in decision[1].
  CHECK(by_pair[{"alice", "bob"}].reads == 5);
  CHECK(by_pair[{"alice", "bob"}].loop);  // bob_says[1] reads alice_says[0], an earlier iteration
  // alice reads bob_says[0] in alice_says[1] and bob_says[0..1] in decision[0].
  CHECK(by_pair[{"bob", "alice"}].reads == 3);
  CHECK(by_pair[{"bob", "alice"}].loop);
  CHECK(steps_to_execution(graph, "bob", 3) == std::optional<size_t>(1));
  CHECK(steps_to_execution(graph, "alice", 7) == std::optional<size_t>(0));
  CHECK_FALSE(steps_to_execution(graph, "alice", 8).has_value());

  const std::string dot = agent_graph_dot(plan, graph);
  for (const char* want : {"\"alice\" [", "\"bob\" [", "\"alice\" -> \"bob\"", "\"bob\" -> \"alice\"",
                           "\"alice\" -> \"alice\"", "\"bob\" -> \"bob\""})
    CHECK(dot.find(want) != std::string::npos);
  CHECK(std::count(dot.begin(), dot.end(), '{') == std::count(dot.begin(), dot.end(), '}'));
}

TEST_CASE("plan: DOT output parses with Graphviz") {
  if (std::system("command -v dot > /dev/null 2>&1") != 0)
    FAIL("graphviz (`dot`) is not installed — run scripts/setup.sh (it installs the Debian package graphviz)");
  for (const char* name : {"prisoners.yaml", "tot.yaml", "maditer.yaml", "madpar.yaml"}) {
    const Plan plan = compile_file(name);
    for (const std::string& text : {agent_graph_dot(plan, agent_step_graph(plan)), call_graph_dot(plan)}) {
      const std::filesystem::path path = std::filesystem::temp_directory_path() / "choreo_plan_test.dot";
      std::ofstream(path) << text;
      INFO(name, "\n", text);
      CHECK(std::system(("dot -Tsvg " + path.string() + " > /dev/null").c_str()) == 0);
      std::filesystem::remove(path);
    }
  }
}

TEST_CASE("plan: DOT quoting escapes quotes, backslashes and newlines") {
  CHECK(dot_quote("a\"b\\c\nd") == "\"a\\\"b\\\\c\\nd\"");
}

}  // namespace
}  // namespace choreo::dsl::plan

namespace choreo::dsl::plan {
namespace {

/// A workflow file beside a schema file, in a directory of its own.
struct PmlDir {
  std::filesystem::path dir;
  PmlDir() {
    dir = std::filesystem::temp_directory_path() / fmt::format("choreo-pml-plan-{}", ::getpid());
    std::filesystem::create_directories(dir);
  }
  ~PmlDir() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  }
};

std::string file_compile_error(const std::string& workflow_path) {
  try {
    compile(load_workflow(workflow_path), {});
  } catch (const InputError& e) {
    return e.render();
  }
  return "";
}

}  // namespace

TEST_CASE("plan: a PML message's schema is loaded and its prompt parsed when the plan is made, so check reports them") {
  PmlDir d;
  const std::string workflow_head =
      "name: w\nmessages:\n  doc:\n    pml: s.pml\n    prompt: '<prompt schema=\"s\"><m/></prompt>'\nsteps:\n"
      "  - decode: {as: a, parents: [doc], header: \"Once\", max_tokens: 2}\n";
  SUBCASE("a missing schema file is an error at its `pml:`") {
    const std::string error = file_compile_error(d.write("w.yaml", workflow_head));
    CHECK(error.find("PML schema file 's.pml' does not exist") != std::string::npos);
    CHECK(error.find("w.yaml:4:") != std::string::npos);
  }
  SUBCASE("a schema with an error is reported at the schema's line") {
    d.write("s.pml", "<schema name=\"s\">\n<module name=\"m\">unclosed\n</schema>\n");
    const std::string error = file_compile_error(d.write("w.yaml", workflow_head));
    CHECK(error.find("s.pml:") != std::string::npos);
  }
  SUBCASE("a path out of the workflow's directory is refused") {
    const std::string error = file_compile_error(d.write(
        "w.yaml", "name: w\nmessages:\n  doc:\n    pml: ../elsewhere.pml\n    prompt: '<prompt schema=\"s\"><m/></prompt>'\n"
                  "steps:\n  - decode: {as: a, parents: [doc], header: \"Once\", max_tokens: 2}\n"));
    CHECK(error.find("leads outside the directory of w.yaml") != std::string::npos);
  }
  SUBCASE("a good schema and prompt compile; a bad prompt is an error at `prompt:`") {
    d.write("s.pml", "<schema name=\"s\"><module name=\"m\">Once upon a time</module></schema>\n");
    CHECK(file_compile_error(d.write("w.yaml", workflow_head)).empty());  // not vacuous: the file is read
    const std::string error = file_compile_error(d.write(
        "w.yaml", "name: w\nmessages:\n  doc:\n    pml: s.pml\n    prompt: '<prompt schema=\"s\"><m>'\n"
                  "steps:\n  - decode: {as: a, parents: [doc], header: \"Once\", max_tokens: 2}\n"));
    CHECK(!error.empty());
  }
}

}  // namespace choreo::dsl::plan
