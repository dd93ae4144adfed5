// Repair policies measured as `profile quality --repair` measures them (runtime/eval/quality_profile.h,
// repair_variants): on madpar (shortened to 8 tokens an answer) on SmolLM2, each policy's KL from the exact
// baseline lies between plain choreo reuse's and 0, and it pays for that with computed tokens. A property of
// the policies, not a recorded number.

#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "common/repair_policy.h"
#include "dsl/workflow_parser.h"
#include "runtime/eval/quality_profile.h"
#include "tests/runtime/workflow_cases.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

dsl::Workflow short_madpar() {
  std::ifstream in(testing::require_file(testing::workflow_source_dir() / "workflows" / "madpar.yaml"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("max_tokens: 512");
  REQUIRE(at != std::string::npos);
  text.replace(at, 15, "max_tokens: 8");
  return dsl::parse_workflow(text, "madpar.yaml");
}

TEST_CASE(
    "repair: KL of first:K and select:R lies between none's and 0 on madpar - SmolLM2 via profile quality") {
  eval::QualityOptions o;
  o.arguments = {{{"problem", "What is the sum of the first five odd numbers?"}}, {}};
  o.models.path = testing::require_file(testing::default_model());
  o.engine.page_tokens = 16;
  o.engine.t0_bytes = size_t(256) << 20;
  // none, then each policy: what `profile quality --repair POLICY` compares, with both policies in one run.
  o.variants = eval::repair_variants(parse_repair_policy("first:16"));
  o.variants.push_back(eval::repair_variants(parse_repair_policy("select:0.15"))[1]);
  const eval::QualityProfile q = eval::profile_quality(short_madpar(), o);
  REQUIRE(q.variants.size() == 3);
  CHECK(q.variants[0].name == "none");
  CHECK(q.variants[1].name == "first:16");
  CHECK(q.variants[2].name == "select:0.15");
  const eval::QualitySummary& none = q.variants[0].workflow;
  MESSAGE("workflow KL: none ", none.kl.mean, ", first:16 ", q.variants[1].workflow.kl.mean, ", select:0.15 ",
          q.variants[2].workflow.kl.mean, "; computed ", none.computed, ", ", q.variants[1].workflow.computed,
          ", ", q.variants[2].workflow.computed, " (baseline ", none.baseline_computed, ")");
  CHECK(none.kl.mean > 0.0);
  for (size_t v = 1; v < 3; ++v) {
    const eval::QualitySummary& repaired = q.variants[v].workflow;
    CAPTURE(q.variants[v].name);
    CHECK(repaired.kl.mean >= 0.0);
    CHECK(repaired.kl.mean < none.kl.mean);
    CHECK(repaired.computed > none.computed);  // the repair is computed, not free
    CHECK(repaired.computed < none.baseline_computed);
    // Round 0 reads only `start`, in its exact prefix position: nothing to repair, the same figures as none.
    REQUIRE(q.variants[v].steps.size() == 3);
    CHECK(q.variants[v].steps[0].kl.mean == q.variants[0].steps[0].kl.mean);
    CHECK(q.variants[v].steps[0].computed == q.variants[0].steps[0].computed);
  }
}

}  // namespace
}  // namespace choreo
