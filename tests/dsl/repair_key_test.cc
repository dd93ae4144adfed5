// The `repair:` key of workflows and calls (docs/workflow-language.md; common/repair_policy.h): parsed into a
// policy, a call's own over the workflow's in the compiled plan, and bad values located at file:line:col with
// what was expected.

#include <doctest/doctest.h>

#include <string>

#include "common/error.h"
#include "common/repair_policy.h"
#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"

namespace choreo::dsl {
namespace {

const char* kWorkflow = R"yaml(name: w
repair: select:0.15
steps:
  - decode: {as: a, header: "Once"}
  - decode: {as: b, header: " Then", parents: [a], repair: first:4}
  - decode: {as: c, header: " Last", parents: [a, b], repair: none}
)yaml";

const plan::Node& node(const plan::Plan& p, const std::string& name) {
  for (const plan::Node& n : p.nodes)
    if (n.name == name) return n;
  FAIL("no node ", name);
  throw;
}

TEST_CASE("repair key: the workflow's policy applies to calls without their own") {
  const Workflow w = parse_workflow(kWorkflow, "w.yaml");
  REQUIRE(w.repair);
  CHECK(w.repair->policy.name() == "select:0.15");
  CHECK(w.repair->where.line == 2);
  const plan::Plan p = plan::compile(w, {});
  CHECK(node(p, "a").repair->name() == "select:0.15");
  CHECK(node(p, "b").repair->name() == "first:4");
  CHECK(node(p, "c").repair->none());
  const Workflow without =
      parse_workflow("name: w\nsteps:\n  - decode: {as: a, header: \"Once\"}\n", "w.yaml");
  CHECK_FALSE(plan::compile(without, {}).nodes.front().repair);
}

TEST_CASE("repair key: a bad policy is an error at its file:line:col that says what is expected") {
  struct Case {
    std::string value;
    std::string message;
  };
  for (const Case& c :
       {Case{"first:0", "K must be a whole number"}, Case{"first:x", "K must be a whole number"},
        Case{"select:1.5", "R must be a fraction"}, Case{"select:0", "R must be a fraction"},
        Case{"blend", "unknown repair policy `blend`"}, Case{"first", "unknown repair policy"}}) {
    CAPTURE(c.value);
    const std::string line = "  - decode: {as: a, header: \"Once\", repair: " + c.value + "}";
    const std::string yaml = "name: w\nsteps:\n" + line + "\n";
    try {
      parse_workflow(yaml, "w.yaml");
      FAIL("accepted");
    } catch (const InputError& e) {
      CHECK(e.where().file == "w.yaml");
      CHECK(e.where().line == 3);
      CHECK(e.where().col == int(line.find(c.value)) + 1);
      CHECK(e.message().find(c.message) != std::string::npos);
      CHECK(e.hint().find("first:K") != std::string::npos);
    }
  }
}

TEST_CASE("repair policies: names read back to the same policy and tags tell every two apart") {
  for (const char* name : {"none", "first:1", "first:16", "select:0.15", "select:1"}) {
    CAPTURE(name);
    const RepairPolicy p = parse_repair_policy(name);
    CHECK(p.name() == name);
    CHECK(RepairPolicy::from_tag(p.tag()) == p);
    CHECK((p.tag() == 0) == p.none());
  }
  CHECK(parse_repair_policy("first:16").tag() != parse_repair_policy("first:17").tag());
  CHECK(parse_repair_policy("select:0.15").tag() != parse_repair_policy("select:0.16").tag());
  CHECK(parse_repair_policy("first:1").tag() != parse_repair_policy("select:1").tag());
}

}  // namespace
}  // namespace choreo::dsl
