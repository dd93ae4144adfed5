// Run and plan agree (issue 10, test 1): for every workflow in workflows/ and in the test corpus
// (tests/workflows/), in the three engine modes and with one instance or four running at once, the calls a
// run issued are the nodes of the plan `choreo check` compiles from the same workflow and arguments, for
// the iterations that ran: same names and kinds in plan order (a plan node the run skipped must be one the
// plan marks conditional), same agents, same parents (a run-time choice: one of the plan's candidates) and
// the same explicit offsets. The run checks this itself while running (exec/plan_follower.h); this test
// checks it again from the outside, from the run's records and a plan compiled separately.

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/instances.h"
#include "runtime/exec/plan_follower.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/kv/page_pool.h"
#include "tests/runtime/workflow_cases.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using dsl::plan::Edge;
using dsl::plan::Node;
using dsl::plan::NodeKind;
using runtime::Mode;

fs::path source_dir() {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  return src ? src : ".";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(testing::require_file(path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The message a record names: a PML piece (`doc/label`) is its message `doc`.
std::string message_of(const std::string& name) { return name.substr(0, name.find('/')); }

/// The run's messages that are plan nodes: PML pieces of one message collapsed into it; modules skipped.
std::vector<const exec::MessageRecord*> plan_level(const exec::RunResult& r) {
  std::vector<const exec::MessageRecord*> out;
  for (const exec::MessageRecord& m : r.messages) {
    if (m.kind == "module") continue;
    if (m.kind == "message" && m.name.find('/') != std::string::npos && !out.empty() &&
        message_of(out.back()->name) == message_of(m.name))
      continue;
    out.push_back(&m);
  }
  return out;
}

/// Parent names with the pieces of one PML message collapsed, with the requested position of the first.
std::vector<std::pair<std::string, std::optional<int>>> parents_of(const exec::MessageRecord& m,
                                                                   const std::set<std::string>& pml) {
  std::vector<std::pair<std::string, std::optional<int>>> out;
  for (size_t i = 0; i < m.parents.size(); ++i) {
    const std::string name = message_of(m.parents[i]);
    if (pml.count(name) && !out.empty() && out.back().first == name) continue;
    out.push_back({name, pml.count(name) ? std::nullopt : m.parent_at.at(i)});
  }
  return out;
}

/// Checks that `result` follows `plan` (see the file comment); returns how many plan nodes it matched.
size_t check_follows(const dsl::plan::Plan& plan, const exec::RunResult& result) {
  std::set<std::string> pml;
  for (const Node& n : plan.nodes)
    if (n.pml) pml.insert(n.name);
  size_t cursor = 0, matched = 0;
  for (const exec::MessageRecord* m : plan_level(result)) {
    const std::string name = message_of(m->name);
    CAPTURE(name);
    while (cursor < plan.nodes.size() && plan.nodes[cursor].name != name) {
      CHECK_MESSAGE(plan.nodes[cursor].conditional, "the run skipped ", plan.nodes[cursor].name,
                    ", which the plan says always runs");
      ++cursor;
    }
    REQUIRE_MESSAGE(cursor < plan.nodes.size(), "the run made ", name, ", which is not in the plan (after it)");
    const Node& n = plan.nodes[cursor];
    CHECK(dsl::plan::kind_name(n.kind) == m->kind);
    if (n.agent != "?") CHECK(n.agent == m->agent);
    CHECK(!n.private_to.empty() == m->is_private);
    const auto got = parents_of(*m, pml);
    const bool choice = std::any_of(n.parents.begin(), n.parents.end(), [](const Edge& e) { return e.selection; });
    if (!choice) {
      REQUIRE(got.size() == n.parents.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].first == plan.nodes[n.parents[i].parent].name);
        if (!pml.count(got[i].first) && !n.parents[i].at_dynamic)
          CHECK(got[i].second == (n.parents[i].at ? std::optional<int>(int(*n.parents[i].at)) : std::nullopt));
      }
    } else {
      std::set<std::string> candidates;
      for (const Edge& e : n.parents) candidates.insert(plan.nodes[e.parent].name);
      for (const auto& [parent, at] : got) CHECK_MESSAGE(candidates.count(parent), parent, " is no candidate");
    }
    ++cursor;
    ++matched;
  }
  for (; cursor < plan.nodes.size(); ++cursor)
    CHECK_MESSAGE(plan.nodes[cursor].conditional, "the run never made ", plan.nodes[cursor].name);
  return matched;
}

TEST_CASE("run and plan agree: every shipped and corpus workflow, three modes, one and four instances") {
  // solvecheck.yaml names the shared math adapter, outside workflows/: as a user would, allow its directory.
  const testing::InputPolicyScope allow(testing::shared_models_dir());
  using testing::WorkflowCase;
  const std::vector<WorkflowCase> all = testing::workflow_cases();
  // Every workflow in workflows/ must be covered: a new one without a case here fails the test.
  for (const auto& entry : fs::directory_iterator(source_dir() / "workflows")) {
    if (entry.path().extension() != ".yaml" || entry.path().stem() == "musique") continue;  // needs data files
    CHECK_MESSAGE(std::any_of(all.begin(), all.end(), [&](const WorkflowCase& c) { return c.file == entry.path(); }),
                  entry.path(), " has no case in plan_agreement_test.cc");
  }
  size_t total = 0;
  for (const WorkflowCase& c : all) {
    const dsl::Workflow workflow = dsl::parse_workflow(read_text(c.file), c.file.string());
    const dsl::plan::Plan plan = dsl::plan::compile(workflow, c.arguments);
    const model::Model& m = c.chat ? *testing::smollm2().model : *testing::stories260k().model;
    const exec::WorkflowModels models = exec::load_workflow_models(workflow, m, {});  // its `models:` beside m
    for (Mode mode : {Mode::Choreo, Mode::Prefix, Mode::Naive}) {
      for (int concurrency : {1, 4}) {
        CAPTURE(c.file);
        CAPTURE(int(mode));
        CAPTURE(concurrency);
        kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(512) << 20);
        runtime::Engine engine(models.set, pool, mode);
        exec::InstancesOptions options;
        options.concurrency = concurrency;
        options.hooks = [](size_t) {
          exec::RunHooks h;
          h.exact_tokens = [](const std::string&) { return std::optional<int>(3); };  // short decodes
          return h;
        };
        const std::vector<exec::InstanceOutcome> outcomes = exec::run_instances(
            workflow, engine, std::vector<exec::RunArguments>(size_t(concurrency), c.arguments), options);
        for (const exec::InstanceOutcome& o : outcomes) {
          if (o.error) {
            try {
              std::rethrow_exception(o.error);
            } catch (const std::exception& e) {
              FAIL_CHECK("the run failed: " << e.what());
            }
            continue;
          }
          total += check_follows(plan, o.result);
        }
      }
    }
  }
  MESSAGE("run/plan agreement: " << total << " plan nodes matched");
}

}  // namespace
}  // namespace choreo

namespace choreo {
namespace {

/// A batch as the run would issue it: the plan's nodes of batch `b`, with parents renamed to run ids.
std::vector<dsl::plan::Branch> as_run(const dsl::plan::Plan& plan, size_t b, uint64_t id_base) {
  std::vector<dsl::plan::Branch> out;
  for (size_t index : plan.batches[b].nodes) {
    dsl::plan::Branch branch;
    branch.node = plan.nodes[index];
    for (dsl::plan::Edge& e : branch.node.parents) e.parent += id_base;
    out.push_back(branch);
  }
  return out;
}

TEST_CASE("plan follower: a run that differs from its plan is an internal error naming both sides") {
  const std::string yaml = R"yaml(name: f
messages:
  a: {text: "Once upon a time"}
  b: {text: " there was"}
steps:
  - decode: {as: x, parents: [a], header: " a"}
  - decode: {as: "y[i]", for: "i in range(2)", parents: [a, x], header: " b"}
  - decode: {as: z, parents: [b, "y[1]"], header: " c", when: "len(x) > 100"}
  - decode: {as: w, parents: [b], header: " d"}
)yaml";
  const dsl::Workflow workflow = dsl::parse_workflow(yaml, "f.yaml");
  const dsl::plan::Plan plan = dsl::plan::compile(workflow, {});
  REQUIRE(plan.batches.size() == 5);
  const uint64_t base = 1000;  // run ids differ from plan indices
  auto follow = [&](exec::PlanFollower& f, size_t b) {
    std::vector<dsl::plan::Branch> branches = as_run(plan, b, base);
    const size_t step = f.match(plan.batches[b].kind, branches);
    for (size_t k = 0; k < f.nodes().size(); ++k) f.created(base + f.nodes()[k], f.nodes()[k]);
    return step;
  };
  {  // the plan itself is followed, and the conditional step may be skipped
    exec::PlanFollower f(plan);
    CHECK(follow(f, 0) == 0);
    CHECK(follow(f, 1) == 1);
    CHECK(follow(f, 2) == 2);
    CHECK(follow(f, 4) == 4);
  }
  {  // a wrong parent
    exec::PlanFollower f(plan);
    follow(f, 0);
    follow(f, 1);
    std::vector<dsl::plan::Branch> branches = as_run(plan, 2, base);
    branches[1].node.parents[0].parent = base + 1;  // b instead of a
    try {
      f.match(NodeKind::Decode, branches);
      FAIL("no mismatch reported");
    } catch (const exec::PlanMismatch& e) {
      const std::string what = e.what();
      CHECK(what.find("internal error") != std::string::npos);
      CHECK(what.find("with parents [b, x]") != std::string::npos);  // the run's side
      CHECK(what.find("with parents [a, x]") != std::string::npos);  // the plan's side
    }
  }
  {  // skipping a step that always runs
    exec::PlanFollower f(plan);
    follow(f, 0);
    std::vector<dsl::plan::Branch> branches = as_run(plan, 2, base);
    CHECK_THROWS_AS(f.match(NodeKind::Decode, branches), exec::PlanMismatch);
  }
  {  // a wrong agent, and a branch the plan does not have
    exec::PlanFollower f(plan);
    follow(f, 0);
    std::vector<dsl::plan::Branch> branches = as_run(plan, 1, base);
    branches[0].node.agent = "mallory";
    CHECK_THROWS_AS(f.match(NodeKind::Decode, branches), exec::PlanMismatch);
    branches = as_run(plan, 1, base);
    branches[0].node.name = "q";
    CHECK_THROWS_AS(f.match(NodeKind::Decode, branches), exec::PlanMismatch);
  }
}

}  // namespace
}  // namespace choreo
