// `choreo profile`'s measurement core (runtime/exec/profile.h): the choreo run generates, call by call,
// exactly what the baseline generated; steps are the decode batches; the ratio estimate is a ratio of means.

#include "runtime/exec/profile.h"

#include <doctest/doctest.h>

#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

const char* kRounds = R"yaml(
name: rounds
inputs: {topic: string}
sampling: {temperature: 0.9, max_tokens: 24, seed: 11}
messages:
  opening: {text: "Once upon a time there was a little dog."}
  ask: {text: "{{ topic }}"}
steps:
  - decode: {as: "answer[0][i]", for: "i in range(3)", header: "Then", parents: [opening, ask], stop: ["."]}
  - decode: {as: "answer[1][i]", for: "i in range(3)", header: "So", parents: [opening, "answer[0][j] for j in range(3) if j != i"]}
output: "{{ answer[1][0] }}"
)yaml";

TEST_CASE("profile: choreo decodes are forced to the baseline's token counts, steps are the decode batches") {
  auto backend = kernels::make_cpu_backend(2);
  auto model = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend);
  const dsl::Workflow workflow = dsl::parse_workflow(kRounds, "rounds.yaml");
  kv::PagePool pool_b(model->backend(), model->kv_layout(16), size_t(64) << 20), pool_c(model->backend(), model->kv_layout(16), size_t(64) << 20);
  runtime::Engine baseline(*model, pool_b, runtime::Mode::Prefix), choreo(*model, pool_c, runtime::Mode::Choreo);
  const exec::ProfiledInstance p =
      exec::profile_instance(workflow, baseline, choreo, {{{"topic", "Lily had a red ball."}}, {}});
  CHECK(p.n_unforced == 0);
  int decodes = 0;
  for (const exec::MessageRecord& b : p.baseline.messages) {
    if (b.kind != "decode") continue;
    ++decodes;
    auto it = std::find_if(p.choreo.messages.begin(), p.choreo.messages.end(),
                           [&](const exec::MessageRecord& c) { return c.name == b.name; });
    REQUIRE(it != p.choreo.messages.end());
    CHECK_MESSAGE(it->n_generated == std::max(b.n_generated, 1), b.name);
  }
  CHECK(decodes == 6);
  for (const exec::RunTiming* t : {&p.baseline_timing, &p.choreo_timing}) {
    REQUIRE(t->steps.size() == 2);
    CHECK(t->steps[0].label == "answer[0][*]");
    CHECK(t->steps[1].label == "answer[1][*]");
    CHECK(t->steps[0].size == 3);
    CHECK(t->ttft_ms == doctest::Approx(t->steps[0].ttft_ms + t->steps[1].ttft_ms));
    CHECK(t->e2e_ms >= t->steps[1].total_ms);
  }
  CHECK(p.baseline_timing.n_generated == p.choreo_timing.n_generated);
  // The second round's parents are cached in choreo mode: only the headers are computed.
  CHECK(p.choreo_timing.steps[1].n_computed < p.baseline_timing.steps[1].n_computed);
}

}  // namespace
}  // namespace choreo
