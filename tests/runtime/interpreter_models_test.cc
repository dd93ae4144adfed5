// Workflows with several models (`models:`, `model:` on agents and calls; docs/workflow-language.md "Models"):
// each call runs on the model it names, reads other models' messages through its own encodings of them, and
// every mistake is an error at its location before anything runs.

#include <doctest/doctest.h>

#include <filesystem>

#include "common/error.h"
#include "dsl/plan/plan.h"
#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/kv/page_pool.h"
#include "tests/model/lora_fixtures.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

const model::Model& smol() { return *testing::smollm2().model; }

/// Runs workflow text on an engine with the workflow's models (model 0: `base` with `base_lora`).
exec::RunResult run(const std::string& text, const model::Model& base = smol(), model::LoraStack base_lora = {}) {
  const testing::InputPolicyScope allow(testing::shared_models_dir());  // the workflows name the shared adapters
  const dsl::Workflow w = dsl::parse_workflow(text, "test.yaml");
  const exec::WorkflowModels models = exec::load_workflow_models(w, base, std::move(base_lora));
  kv::PagePool pool(base.backend(), base.kv_layout(16), size_t(256) << 20);
  runtime::Engine engine(models.set, pool);
  return exec::run_workflow(w, engine, {});
}

std::string run_error(const std::string& text, const model::Model& base = smol()) {
  try {
    run(text, base);
  } catch (const InputError& e) {
    return e.render();  // location, message, quoted line and hint
  }
  return {};
}

const exec::MessageRecord& message(const exec::RunResult& r, const std::string& name) {
  auto it = std::find_if(r.messages.begin(), r.messages.end(), [&](auto& m) { return m.name == name; });
  REQUIRE_MESSAGE(it != r.messages.end(), "no message ", name);
  return *it;
}

std::string with_lora(std::string text) {
  const size_t at = text.find("MATH_LORA");
  REQUIRE(at != std::string::npos);
  return text.replace(at, 9, testing::math_lora());
}

const char* kPair = R"Y(
name: pair
models:
  math: {lora: MATH_LORA}
agents:
  solver: {model: math}
  critic:
messages:
  q: {role: user, text: "What is 12 + 30?"}
steps:
  - decode: {as: a, agent: solver, parents: [q], role: assistant, max_tokens: 8, temperature: 0}
  - decode: {as: b, agent: critic, parents: [q, a], role: user, header: "Is that right?", max_tokens: 8, temperature: 0}
output: "{{ a }}|{{ b }}"
)Y";

TEST_CASE("workflow models: an agent's calls run on its model and read other models' messages through their own encodings") {
  const exec::RunResult r = run(with_lora(kPair));
  const exec::MessageRecord& q = message(r, "q");
  const exec::MessageRecord& a = message(r, "a");
  const exec::MessageRecord& b = message(r, "b");
  CHECK(a.model == "math");
  CHECK(b.model.empty());
  // The solver (math adapter) encoded the question for itself; the critic (the base) encoded the answer.
  CHECK(a.n_cross_model == int(q.tokens.size()));
  CHECK(b.n_cross_model == int(a.tokens.size()));

  // The solver's answer is what a run with the adapter as the only model gives; without it, it differs.
  std::string single = kPair;
  single.erase(single.find("models:"), single.find("agents:") - single.find("models:"));
  single.replace(single.find("{model: math}"), 13, "");
  model::LoraStack math{{{model::LoraAdapter::load(testing::math_lora(), smol()), 1.0f}}};
  const exec::RunResult on_math = run(single, smol(), math);
  const exec::RunResult on_base = run(single);
  CHECK(message(on_math, "a").text == a.text);
  CHECK(message(on_math, "a").tokens == a.tokens);
  CHECK(message(on_base, "a").tokens != a.tokens);
}

TEST_CASE("workflow models: a call's own `model:` wins over its agent's, and `default` is the run's model") {
  std::string text = with_lora(kPair);
  text.replace(text.find("agent: solver,"), 14, "agent: solver, model: default,");
  const exec::RunResult r = run(text);
  CHECK(message(r, "a").model.empty());
  CHECK(message(r, "a").n_cross_model == 0);
  CHECK(message(r, "b").n_cross_model == 0);
  const exec::RunResult plain = run(with_lora(kPair));
  CHECK(message(r, "a").tokens != message(plain, "a").tokens);
}

TEST_CASE("workflow models: mistakes are errors at their location, before anything runs") {
  const auto fails = [](const std::string& text, const std::string& where, const std::string& what) {
    const std::string e = run_error(text);
    CAPTURE(e);
    CHECK(e.find(where) != std::string::npos);
    CHECK(e.find(what) != std::string::npos);
  };
  // A call naming a model that is not declared (with a suggestion).
  std::string text = with_lora(kPair);
  text.replace(text.find("agent: critic,"), 14, "agent: critic, model: maths,");
  fails(text, "test.yaml:12:", "unknown model `maths`");
  fails(text, "test.yaml:12:", "math");
  // An agent's model.
  text = with_lora(kPair);
  text.replace(text.find("{model: math}"), 13, "{model: other}");
  fails(text, "test.yaml:6:", "unknown model `other`");
  // `default` cannot be declared.
  text = with_lora(kPair);
  text.replace(text.find("  math: {lora"), 6, "  default");
  fails(text, "test.yaml:4:", "`default` names the run's model");
  // Files that are not there.
  text = kPair;
  text.replace(text.find("MATH_LORA"), 9, "no-such-adapter.gguf");
  fails(text, "test.yaml:4:", "LoRA adapter 'no-such-adapter.gguf' is not a file");
  text = with_lora(kPair);
  text.replace(text.find("{lora:"), 6, "{file: no-such-model.gguf, lora:");
  fails(text, "test.yaml:4:", "model file 'no-such-model.gguf' is not a file");
  // An adapter for other weights: the tensor is named, at the declaration.
  const std::string on_stories = run_error(with_lora(kPair), *testing::stories260k().model);
  CHECK(on_stories.find("test.yaml:4:") != std::string::npos);
  CHECK(on_stories.find("blk.0.attn_q.weight.lora_a") != std::string::npos);
  // A GGUF that cannot run beside the base.
  text = kPair;
  text.replace(text.find("{lora: MATH_LORA}"), 17, testing::shared_file("models/stories260K.gguf"));
  fails(text, "test.yaml:4:", "cannot run beside");
  // An engine without the workflow's models (as `eval` builds one).
  kv::PagePool pool(smol().backend(), smol().kv_layout(16), size_t(64) << 20);
  runtime::Engine engine(smol(), pool);
  try {
    exec::run_workflow(dsl::parse_workflow(with_lora(kPair), "test.yaml"), engine, {});
    FAIL("ran");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("model `math` is not loaded") != std::string::npos);
  }
}

TEST_CASE("workflow models: files a workflow names stay inside its directory unless --allow-path allows more") {
  // A workflow file in a scratch directory, naming the shared adapter (outside it) three ways.
  const testing::ScratchDir dir;
  const std::filesystem::path adapter = testing::math_lora();
  std::filesystem::create_symlink(adapter, dir.path / "link.gguf");
  std::filesystem::create_directories(dir.path / "sub");
  std::filesystem::copy_file(adapter, dir.path / "sub" / "copy.gguf");
  const auto load = [&](const std::string& lora) {
    std::string text = kPair;
    text.replace(text.find("MATH_LORA"), 9, lora);
    const dsl::Workflow w = dsl::parse_workflow(text, (dir.path / "wf.yaml").string());
    return exec::load_workflow_models(w, smol(), {});
  };
  const auto refused = [&](const std::string& lora) {
    try {
      load(lora);
    } catch (const InputError& e) {
      const std::string text = e.render();
      CAPTURE(text);
      CHECK(text.find("wf.yaml:4:") != std::string::npos);
      CHECK(text.find("LoRA adapter '" + lora + "' leads outside the directory of wf.yaml") != std::string::npos);
      CHECK(text.find("--allow-path") != std::string::npos);
      return true;
    }
    return false;
  };
  CHECK(refused(adapter.string()));                                      // absolute, outside
  CHECK(refused("link.gguf"));                                           // a link inside that leads out
  CHECK(refused((std::filesystem::relative(adapter, dir.path)).string()));  // ../.. out of the directory
  CHECK(refused("/nonexistent-choreo-dir/x.gguf"));  // outside and missing: the error does not tell which
  CHECK(load("sub/copy.gguf").set.size() == 2);                          // below it: read
  CHECK(load((dir.path / "sub" / "copy.gguf").string()).set.size() == 2);  // absolute, inside
  // Allowed, as with --allow-path DIR: every form above is read.
  const testing::InputPolicyScope allow(testing::shared_models_dir());
  CHECK(load(adapter.string()).set.size() == 2);
  CHECK(load("link.gguf").set.size() == 2);
}

TEST_CASE("workflow models: `reuse:` sets how a model reads another's messages, and partial over every layer is recompute") {
  const auto with_plan = [](const std::string& plan) {
    std::string text = with_lora(kPair);
    const std::string decl = "math: {lora: " + testing::math_lora() + "}";
    text.replace(text.find(decl), decl.size(),
                 "math: {lora: " + testing::math_lora() + ", reuse: {from: default, " + plan + "}}");
    return text;
  };
  const exec::RunResult recompute = run(with_lora(kPair));
  const exec::RunResult all_layers = run(with_plan("plan: partial, layers: [0, 30]"));
  CHECK(message(all_layers, "a").tokens == message(recompute, "a").tokens);
  CHECK(message(all_layers, "a").n_cross_model == message(recompute, "a").n_cross_model);
  const exec::RunResult reuse = run(with_plan("plan: reuse"));
  CHECK(message(reuse, "a").n_cross_model == 0);
  const exec::RunResult none = run(with_plan("plan: partial, layers: [12, 12]"));
  CHECK(message(none, "a").tokens == message(reuse, "a").tokens);
  // Mistakes, at their location.
  const std::string wide = run_error(with_plan("plan: partial, layers: [3, 31]"));
  CHECK(wide.find("test.yaml:4:") != std::string::npos);
  CHECK(wide.find("[0, 30]") != std::string::npos);
  const std::string sender = run_error(with_plan("plan: reuse").replace(with_plan("plan: reuse").find("from: default"), 13, "from: nobody"));
  CHECK(sender.find("unknown model `nobody`") != std::string::npos);
  const std::string kind = run_error(with_plan("plan: partal, layers: [1, 2]"));
  CHECK(kind.find("unknown plan `partal`") != std::string::npos);
  CHECK(kind.find("partial") != std::string::npos);
  const std::string no_layers = run_error(with_plan("plan: partial"));
  CHECK(no_layers.find("needs `layers: [s, e]`") != std::string::npos);
}

TEST_CASE("workflow models: only the messages the plan shows a model with a partial plan reading save an E cache") {
  // The solver (math) reads q, and the critic's b is made over q as well; n and c are read by the base alone.
  std::string text = R"Y(
name: ecache
models:
  math: {lora: MATH_LORA, reuse: {from: default, plan: partial, layers: [10, 15]}}
agents:
  solver: {model: math}
  critic:
messages:
  q: {role: user, text: "What is 12 + 30?"}
  n: {role: user, text: "Say hello."}
steps:
  - decode: {as: c, agent: critic, parents: [n], role: assistant, max_tokens: 3, temperature: 0}
  - decode: {as: a, agent: solver, parents: [q], role: assistant, max_tokens: 3, temperature: 0}
  - decode: {as: b, agent: critic, parents: [q, a], role: user, header: "Right?", max_tokens: 3, temperature: 0}
output: "{{ a }}|{{ b }}|{{ c }}"
)Y";
  text = with_lora(text);
  const testing::InputPolicyScope allow(testing::shared_models_dir());
  const dsl::Workflow w = dsl::parse_workflow(text, "test.yaml");
  const exec::WorkflowModels models = exec::load_workflow_models(w, smol(), {});
  kv::PagePool pool(smol().backend(), smol().kv_layout(16), size_t(256) << 20);
  runtime::Engine engine(models.set, pool);
  const exec::RunResult r = exec::run_workflow(w, engine, {});
  const kv::TierStats s = engine.tier_stats();
  CHECK(s.e_saved == 1);  // q alone (not the base's copy of a either: only the solver, who wrote a, reads over it)
  CHECK(s.e_saved_bytes == message(r, "q").tokens.size() * size_t(smol().config().dim) * sizeof(float));
  CHECK(message(r, "a").n_cross_model == int(message(r, "q").tokens.size()));
  CHECK(s.e_recomputed_tokens == 0);
}

TEST_CASE("workflow models: the compiled plan records each call's model without loading any") {
  const dsl::plan::Plan plan = dsl::plan::compile(dsl::parse_workflow(with_lora(kPair), "test.yaml"), {});
  bool saw_a = false, saw_b = false;
  for (const dsl::plan::Node& n : plan.nodes) {
    if (n.name == "a") {
      saw_a = true;
      REQUIRE(n.model);
      CHECK(n.model->value == "math");
    }
    if (n.name == "b") {
      saw_b = true;
      CHECK(!n.model);
    }
  }
  CHECK((saw_a && saw_b));
}

}  // namespace
}  // namespace choreo
