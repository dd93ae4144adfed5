// PML prompts as workflow messages (`{pml: FILE, prompt: "<prompt ...>"}`): the message is the imported
// modules at their schema positions plus the uncached text, and a decode over it sees exactly the prompt —
// the same logits as a plain KV-cache pass over BOS + the prompt's tokens + the header, when the schema has
// no gaps (no unions or parameters) and the modules are imported in schema order.

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/exec/interpreter.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/session.h"
#include "runtime/pml/prompt_plan.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

constexpr const char* kSchema = R"(<schema name="park">
Once upon a time, there was a little dog.
<module name="ball">The dog had a red ball.</module>
<module name="friend">One day, the dog met a cat.</module>
</schema>
)";

const char* kWorkflow = R"yaml(
name: pml
inputs: {question: string}
sampling: {temperature: 0, max_tokens: 12}
messages:
  story: {pml: "{{ dir }}/park.pml", prompt: "<prompt schema='park'><ball/><friend/> {{ question }}</prompt>"}
steps:
  - decode: {as: answer, header: " Then", parents: [story]}
  - decode: {as: again, header: " Then", parents: [story]}
output: "{{ answer }}"
)yaml";

TEST_CASE("a PML message: modules encoded once at their positions, a decode over it equals one plain pass") {
  auto backend = kernels::make_cpu_backend(2);
  auto model = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "choreo_pml_workflow_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "park.pml") << kSchema;

  std::string text = kWorkflow;
  text.replace(text.find("{{ dir }}"), 9, dir.string());
  // The workflow lives beside its schema: a pml: path must stay inside the workflow's directory.
  const dsl::Workflow workflow = dsl::parse_workflow(text, (dir / "pml.yaml").string());
  kv::PagePool pool(model->backend(), model->kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(*model, pool);
  exec::RunHooks hooks;
  hooks.record_logits = [](const std::string& name) { return name == "answer"; };
  const exec::RunResult r = exec::run_workflow(workflow, engine, {{{"question", "Where did they go?"}}, {}}, hooks);

  // The independent reference: the prompt's tokens as plan_prompt lays them out (tokenisation documented in
  // docs/pml.md; contiguous in this schema), then the decode's header, in one plain session.
  const runtime::pml::Layout layout = runtime::pml::lay_out(dsl::pml::parse_schema(kSchema, "park.pml"), *model);
  const runtime::pml::PromptPlan plan = runtime::pml::plan_prompt(
      layout, dsl::pml::parse_prompt("<prompt schema='park'><ball/><friend/> Where did they go?</prompt>", {}), *model);
  std::vector<model::Token> prompt;
  if (model->vocab().add_bos()) prompt.push_back(model->vocab().bos());
  for (const auto& [pos, token] : plan.positioned_tokens()) {
    REQUIRE(pos == int(prompt.size()));  // no gaps in this schema
    prompt.push_back(token);
  }
  for (model::Token t : model->vocab().tokenize(" Then", false, true)) prompt.push_back(t);

  auto it = std::find_if(r.messages.begin(), r.messages.end(), [](auto& m) { return m.name == "answer"; });
  REQUIRE(it != r.messages.end());
  const exec::MessageRecord& answer = *it;
  REQUIRE(!answer.logits.empty());
  kv::PagePool plain_pool(model->backend(), model->kv_layout(16), size_t(64) << 20);
  model::Session session(*model, plain_pool);
  std::vector<float> logits;
  session.eval(prompt, &logits);
  const size_t n_header = answer.tokens.size() - size_t(answer.n_generated);
  double worst = 0, range = 0;
  for (size_t step = 0; step < answer.logits.size(); ++step) {
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    range = std::max(range, double(*hi - *lo));
    for (size_t v = 0; v < logits.size(); ++v)
      worst = std::max(worst, double(std::fabs(answer.logits[step][v] - logits[v])));
    if (step + 1 < answer.logits.size()) {
      const model::Token next = answer.tokens[n_header + step];
      session.eval(std::span<const model::Token>(&next, 1), &logits);
    }
  }
  MESSAGE("worst |Δlogit| / range = ", worst / range);
  CHECK(worst / range < 1e-5);

  // The modules were encoded once: the second decode over the same message computes only its header.
  // The run records the schema pass as "module" messages: each cached piece once, all its tokens computed.
  int module_computed = 0, part_computed = 0, module_tokens = 0;
  std::set<kv::MessageId> module_ids;
  for (const exec::MessageRecord& m : r.messages) {
    if (m.kind == "module") {
      CHECK(module_ids.insert(m.id).second);
      module_computed += m.n_computed;
      module_tokens += int(m.tokens.size());
    } else if (m.name.rfind("story/", 0) == 0 && m.name != "story/text") {
      part_computed += m.n_computed;
    }
  }
  CHECK(part_computed == 0);  // cached pieces are reused by the message (encoded by the schema pass)
  CHECK(module_computed > 0);
  CHECK(module_computed == module_tokens);
  auto again = std::find_if(r.messages.begin(), r.messages.end(), [](auto& m) { return m.name == "again"; });
  REQUIRE(again != r.messages.end());
  CHECK(again->tokens == answer.tokens);
  std::filesystem::remove_all(dir);
}

TEST_CASE("PML message errors: a prompt without a schema file, a missing file, a role") {
  auto error_of = [](const std::string& yaml) {
    try {
      dsl::parse_workflow(yaml, "w.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string head = "name: w\nmessages:\n  m: ";
  const std::string tail = "\nsteps:\n  - decode: {as: d, header: x, parents: [m]}\n";
  CHECK(error_of(head + "{prompt: \"<prompt schema='s'/>\"}" + tail).find("no `pml:` schema file") !=
        std::string::npos);
  CHECK(error_of(head + "{pml: s.pml}" + tail).find("has `pml:` but no `prompt:`") != std::string::npos);
  CHECK(error_of(head + "{pml: s.pml, role: user, prompt: \"<prompt schema='s'/>\"}" + tail)
            .find("takes no `role:`") != std::string::npos);

  auto backend = kernels::make_cpu_backend(1);
  auto model = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend);
  kv::PagePool pool(model->backend(), model->kv_layout(16), size_t(16) << 20);
  runtime::Engine engine(*model, pool);
  const dsl::Workflow missing = dsl::parse_workflow(head + "{pml: no/such.pml, prompt: \"<prompt schema='s'/>\"}" + tail, "w.yaml");
  CHECK_THROWS_WITH_AS(exec::run_workflow(missing, engine, {}), doctest::Contains("w.yaml:3:"), InputError);
}

}  // namespace
}  // namespace choreo
