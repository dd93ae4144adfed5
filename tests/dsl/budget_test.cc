// The work bound (dsl/budget.h): a run and a check spend one step per `repeat` iteration, per `for` branch and
// per call without `for`, so both pass with exactly that many steps and both stop one step earlier, at the
// same loop; a check that may stop early (`until` on generated text) counts every iteration it may reach.

#include "dsl/budget.h"

#include <doctest/doctest.h>

#include <string>

#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"
#include "runtime/kv/page_pool.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

// 1 call + 3 iterations + 3 x 2 branches = 10 steps; the last one is the last branch of the fan-out (line 7).
const char* kWorkflow = R"yaml(name: b
messages:
  m: {text: "Once upon a time"}
steps:
  - prefill: {as: p, text: " there", parents: [m]}
  - repeat: "r in range(3)"
    steps:
      - decode: {as: "d[r][i]", for: "i in range(2)", parents: [m, p], header: " a", max_tokens: 1}
)yaml";

/// The InputError a check with this bound throws, or nullopt when it passes.
std::optional<InputError> check_error(const std::string& yaml, int64_t max_steps) {
  try {
    dsl::plan::compile(dsl::parse_workflow(yaml, "w.yaml"), {{}, {}, max_steps});
  } catch (const InputError& e) {
    return e;
  }
  return std::nullopt;
}

std::optional<InputError> run_error(const std::string& yaml, int64_t max_steps) {
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(m, pool, runtime::Mode::Choreo);
  try {
    exec::run_workflow(dsl::parse_workflow(yaml, "w.yaml"), engine, {{}, {}, max_steps});
  } catch (const InputError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("work bound: check and run spend one step per iteration, branch and call, and stop at the same loop") {
  CHECK(!check_error(kWorkflow, 10));
  CHECK(!run_error(kWorkflow, 10));
  const std::optional<InputError> checked = check_error(kWorkflow, 9);
  const std::optional<InputError> ran = run_error(kWorkflow, 9);
  REQUIRE(checked);
  REQUIRE(ran);
  for (const InputError& e : {*checked, *ran}) {
    CHECK(e.message().find("work bound of 9 steps") != std::string::npos);
    CHECK(e.hint().find("--max-steps") != std::string::npos);
    CHECK(e.where().file == "w.yaml");
    CHECK(e.where().line == 8);
    CHECK(e.where().col == int(e.quoted_line().find("i in range(2)")) + 1);  // the `for:` header
    CHECK(e.quoted_line().find("for: \"i in range(2)\"") != std::string::npos);
  }
  CHECK(checked->what() == std::string(ran->what()));
}

TEST_CASE("work bound: a loop that may stop early is counted to its end, by the check and by the run alike") {
  // The run would stop after the first iteration (the decode's one token is always 'there' or not: either
  // way `until: true` stops it), but a run follows its plan, compiled first, and the plan holds every
  // iteration the loop may run: 1000 iterations and 1000 calls. So both fail at 1999 steps and pass at 2000.
  const std::string yaml = R"yaml(name: u
messages:
  m: {text: "Once upon a time"}
steps:
  - repeat: "r in range(1000)"
    until: "len(d[r]) >= 0"
    steps:
      - decode: {as: "d[r]", parents: [m], header: " a", max_tokens: 1}
)yaml";
  const std::optional<InputError> checked = check_error(yaml, 1999);
  const std::optional<InputError> ran = run_error(yaml, 1999);
  REQUIRE(checked);
  REQUIRE(ran);
  CHECK(checked->where().line == 8);  // the last step spent is the 1000th call
  CHECK(checked->what() == std::string(ran->what()));
  CHECK(!check_error(yaml, 2000));
  CHECK(!run_error(yaml, 2000));
}

TEST_CASE("work bound: the bound must be at least 1") {
  const std::optional<InputError> e = check_error(kWorkflow, 0);
  REQUIRE(e);
  CHECK(e->message().find("--max-steps") != std::string::npos);
}

}  // namespace choreo
