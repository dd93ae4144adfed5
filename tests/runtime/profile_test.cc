// `choreo profile`'s measurement core (runtime/exec/profile.h): the choreo run generates, call by call,
// exactly what the baseline generated; steps are the decode batches; the ratio estimate is a ratio of means.
// profile_workflow (what `choreo profile` calls) runs each instance as profile_instance does on fresh
// engines, sums the steps over instances, and writes its JSON document, marked incomplete when an instance
// fails.

#include "runtime/exec/profile.h"

#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "runtime/engine/open_engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
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

const std::vector<std::string> kTopics = {"Lily had a red ball.", "Tom saw a big cat.", "Sam made a boat."};

/// A JSON Lines file in `dir`, one row per topic.
std::string write_rows(const testing::ScratchDir& dir, const std::vector<std::string>& topics) {
  const std::string path = (dir.path / "rows.jsonl").string();
  std::ofstream out(path);
  for (const std::string& topic : topics) out << nlohmann::json{{"topic", topic}}.dump() << "\n";
  return path;
}

/// profile_workflow's options for kRounds on stories260K, one instance per line of `inputs`.
exec::WorkflowProfileOptions rounds_options(const std::string& inputs) {
  exec::WorkflowProfileOptions o;
  o.inputs_path = inputs;
  o.limit = 0;
  o.models.path = testing::shared_file("models/stories260K.gguf");
  o.models.n_threads = 2;  // as testing::stories260k(): the same sums, so the same samples
  o.engine.page_tokens = 16;
  o.engine.t0_bytes = size_t(64) << 20;
  return o;
}

/// profile_instance on fresh engines over the shared stories260K, opened with `engine`'s options.
exec::ProfiledInstance fresh_instance(const dsl::Workflow& workflow, const runtime::EngineOptions& engine,
                                      const exec::RunArguments& arguments) {
  const runtime::ModelSet models(*testing::stories260k().model);
  runtime::EngineOptions baseline = engine, choreo = engine;
  baseline.mode = runtime::Mode::Prefix;
  choreo.mode = runtime::Mode::Choreo;
  const auto b = runtime::open_engine(models, baseline);
  const auto c = runtime::open_engine(models, choreo);
  return exec::profile_instance(workflow, b->engine(), c->engine(), arguments);
}

void check_same_work(const exec::RunTiming& a, const exec::RunTiming& b) {
  CHECK(a.n_computed == b.n_computed);
  CHECK(a.n_reused == b.n_reused);
  CHECK(a.n_generated == b.n_generated);
  REQUIRE(a.steps.size() == b.steps.size());
  for (size_t k = 0; k < a.steps.size(); ++k) {
    CHECK(a.steps[k].label == b.steps[k].label);
    CHECK(a.steps[k].n_computed == b.steps[k].n_computed);
    CHECK(a.steps[k].n_reused == b.steps[k].n_reused);
  }
}

TEST_CASE("profile: profile_workflow runs each instance as profile_instance does, and sums the steps up") {
  const dsl::Workflow workflow = dsl::parse_workflow(kRounds, "rounds.yaml");
  testing::ScratchDir dir;
  exec::WorkflowProfileOptions options = rounds_options(write_rows(dir, kTopics));
  options.limit = 2;
  options.cold = true;  // every instance on fresh engines, as fresh_instance runs it
  options.json_path = (dir.path / "profile.json").string();
  size_t progress = 0;
  options.on_instance = [&](size_t index, size_t count, const exec::ProfiledInstance&) {
    CHECK(index == progress++);
    CHECK(count == 2);
  };
  const exec::WorkflowProfile p = exec::profile_workflow(workflow, options);
  CHECK(progress == 2);
  REQUIRE(p.instances.size() == 2);  // --limit
  CHECK(p.workflow == "rounds");
  CHECK(p.baseline_mode == runtime::Mode::Prefix);
  double b_computed = 0, c_computed = 0;
  for (size_t i = 0; i < 2; ++i) {
    const exec::ProfiledRow& row = p.instances[i];
    CHECK(row.line == int(i) + 1);
    CAPTURE(row.line);
    const exec::ProfiledInstance alone =
        fresh_instance(workflow, options.engine, {{{"topic", kTopics[i]}}, {}});
    check_same_work(row.runs.baseline_timing, alone.baseline_timing);
    check_same_work(row.runs.choreo_timing, alone.choreo_timing);
    CHECK(row.runs.choreo.output == alone.choreo.output);
    CHECK(row.runs.baseline_timing.n_generated == row.runs.choreo_timing.n_generated);
    b_computed += row.runs.baseline_timing.n_computed;
    c_computed += row.runs.choreo_timing.n_computed;
  }
  CHECK(c_computed < b_computed);  // choreo encodes the shared parents once
  CHECK(p.means.baseline_computed == doctest::Approx(b_computed / 2));
  CHECK(p.means.choreo_computed == doctest::Approx(c_computed / 2));
  CHECK(p.n_unforced == 0);
  // One summary per decode step, over both instances.
  REQUIRE(p.steps.size() == 2);
  CHECK(p.steps[0].label == "answer[0][*]");
  CHECK(p.steps[1].label == "answer[1][*]");
  for (size_t k = 0; k < 2; ++k) {
    CHECK(p.steps[k].n == 2);
    CHECK(p.steps[k].choreo_computed == double(p.instances[0].runs.choreo_timing.steps[k].n_computed +
                                               p.instances[1].runs.choreo_timing.steps[k].n_computed));
  }
  CHECK(p.steps[1].choreo_computed < p.steps[1].baseline_computed);
  // The ratio is of the means: the sums' ratio.
  const double b_ttft =
      p.instances[0].runs.baseline_timing.ttft_ms + p.instances[1].runs.baseline_timing.ttft_ms;
  const double c_ttft = p.instances[0].runs.choreo_timing.ttft_ms + p.instances[1].runs.choreo_timing.ttft_ms;
  CHECK(p.ttft.ratio == doctest::Approx(b_ttft / c_ttft));
  // The JSON document is the one profile_json gives, with both instances.
  const nlohmann::json written = nlohmann::json::parse(testing::read_file(options.json_path));
  CHECK(written == nlohmann::json::parse(exec::profile_json(p).dump()));
  CHECK(written["instances"].size() == 2);
  CHECK(written["instances"][1]["line"] == 2);
  CHECK(written["instances"][0]["choreo"]["computed"] == p.instances[0].runs.choreo_timing.n_computed);
  CHECK(!written.contains("incomplete"));
}

TEST_CASE("profile: profile_workflow's choreo engine lives across instances unless cold") {
  const dsl::Workflow workflow = dsl::parse_workflow(kRounds, "rounds.yaml");
  testing::ScratchDir dir;
  exec::WorkflowProfileOptions options = rounds_options(write_rows(dir, {kTopics[0], kTopics[1]}));
  const exec::WorkflowProfile warm = exec::profile_workflow(workflow, options);
  options.cold = true;
  const exec::WorkflowProfile cold = exec::profile_workflow(workflow, options);
  REQUIRE(warm.instances.size() == 2);
  REQUIRE(cold.instances.size() == 2);
  // The first instance starts from empty caches either way.
  check_same_work(warm.instances[0].runs.choreo_timing, cold.instances[0].runs.choreo_timing);
  // The second reuses the opening the first encoded, when the engine is kept; the baseline is always fresh.
  CHECK(warm.instances[1].runs.choreo_timing.n_computed < cold.instances[1].runs.choreo_timing.n_computed);
  check_same_work(warm.instances[1].runs.baseline_timing, cold.instances[1].runs.baseline_timing);
}

TEST_CASE("profile: an instance that fails leaves the JSON document of the instances before it, incomplete") {
  const dsl::Workflow workflow = dsl::parse_workflow(kRounds, "rounds.yaml");
  testing::ScratchDir dir;
  std::string long_topic;
  for (int i = 0; i < 400; ++i) long_topic += "Lily had a red ball and a blue kite. ";  // past the context
  exec::WorkflowProfileOptions options = rounds_options(write_rows(dir, {kTopics[0], long_topic}));
  options.json_path = (dir.path / "profile.json").string();
  CHECK_THROWS(exec::profile_workflow(workflow, options));
  const nlohmann::json written = nlohmann::json::parse(testing::read_file(options.json_path));
  CHECK(written["incomplete"] == true);
  CHECK(written["instances"].size() == 1);
  const std::string error = written["error"];
  CHECK(error.rfind("row at line 2: ", 0) == 0);
  CHECK_MESSAGE(error.find("context") != std::string::npos, error);  // the overlong row, not another failure
  CHECK(!written.contains("ttft_ratio"));
}

TEST_CASE(
    "profile: profile_workflow refuses choreo as the baseline and an unwritable JSON path before loading") {
  const dsl::Workflow workflow = dsl::parse_workflow(kRounds, "rounds.yaml");
  exec::WorkflowProfileOptions options = rounds_options("");
  options.arguments = {{{"topic", "Lily had a red ball."}}, {}};
  options.models.path = "/nonexistent/model.gguf";  // never loaded
  options.baseline_mode = runtime::Mode::Choreo;
  CHECK(testing::input_error_text([&] { exec::profile_workflow(workflow, options); }).find("--baseline") !=
        std::string::npos);
  options.baseline_mode = runtime::Mode::Naive;
  options.json_path = "/nonexistent/dir/profile.json";
  CHECK(testing::input_error_text([&] { exec::profile_workflow(workflow, options); }).find("--json") !=
        std::string::npos);
}

}  // namespace
}  // namespace choreo
