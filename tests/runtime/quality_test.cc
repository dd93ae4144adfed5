// The quality profiler (runtime/eval/quality.h, quality_profile.h): choreo mode teacher-forced to the prefix
// baseline's tokens, compared call by call. Where choreo mode computes what the baseline computes (a chain of
// decodes, each reading the calls before it: prefix mode reuses those same messages) the distributions are
// bit-identical, so KL is exactly 0, the baseline's token ranks first and greedy agreement is 1. Where a call
// reads parents encoded without seeing each other (madpar's later rounds), KL is above 0, and its value is
// the mean over positions of KL(baseline || choreo), recomputed here in float64 from the two logit vectors.

#include "runtime/eval/quality.h"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dsl/workflow_parser.h"
#include "runtime/engine/open_engine.h"
#include "runtime/eval/divergence.h"
#include "runtime/eval/quality_profile.h"
#include "tests/runtime/workflow_cases.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

/// Fresh prefix-mode and choreo-mode engines over one model.
struct EnginePair {
  runtime::ModelSet models;
  std::unique_ptr<runtime::OpenedEngine> baseline, choreo;
  explicit EnginePair(const model::Model& model) : models(model) {
    runtime::EngineOptions o;
    o.page_tokens = 16;
    o.t0_bytes = size_t(256) << 20;
    o.mode = runtime::Mode::Prefix;
    baseline = runtime::open_engine(models, o);
    o.mode = runtime::Mode::Choreo;
    choreo = runtime::open_engine(models, o);
  }
};

eval::QualityInstance compare(const model::Model& model, const dsl::Workflow& workflow,
                              const exec::RunArguments& arguments) {
  EnginePair e(model);
  runtime::Engine* variants[] = {&e.choreo->engine()};
  return eval::compare_instance(workflow, e.baseline->engine(), variants, arguments);
}

// A prefix chain: each decode reads the decodes before it, in order, so choreo mode attends to the same
// messages as prefix mode's reused prefix. Greedy, so the baseline's token is its own argmax.
const char* kChain = R"yaml(
name: chain
sampling: {temperature: 0, max_tokens: 8}
steps:
  - decode: {as: a, header: "Once upon a time"}
  - decode: {as: b, header: " Then the dog", parents: [a]}
  - decode: {as: c, header: " In the end,", parents: [a, b]}
output: "{{ c }}"
)yaml";

TEST_CASE("quality: KL is 0 where choreo mode is exact - a prefix chain") {
  const dsl::Workflow workflow = dsl::parse_workflow(kChain, "chain.yaml");
  for (testing::LoadedModel* m : {&testing::stories260k(), &testing::smollm2()}) {
    CAPTURE(m->model->file().path());
    const eval::QualityInstance q = compare(*m->model, workflow, {});
    REQUIRE(q.variants.size() == 1);
    const eval::VariantRun& run = q.variants[0];
    CHECK(run.n_unforced == 0);
    REQUIRE(run.calls.size() == 3);
    for (const eval::CallQuality& c : run.calls) {
      CAPTURE(c.call);
      CHECK(c.n_positions == 8);
      CHECK(c.kl_sum == 0.0);
      CHECK(c.kl_max == 0.0);
      CHECK(c.rank_max == 1);
      CHECK(c.agreement() == 1.0);
      CHECK(c.computed == c.baseline_computed);  // prefix mode reuses exactly what choreo mode reads
    }
    CHECK(run.calls[2].call == "c");
    CHECK(run.calls[2].step == "c");
    const eval::VariantQuality s = eval::summarize_variant({q}, 0, "choreo", "chain");
    CHECK(s.workflow.kl.mean == 0.0);
    CHECK(s.workflow.rank.mean == 1.0);
    CHECK(s.workflow.agreement.mean == 1.0);
    CHECK(s.workflow.n_positions == 24);
  }
}

// madpar's shape with every first-round answer a decode of its own (no static parent, so round 0 and `recap`
// read a prefix); in round 1 each agent reads the other two answers, the second encoded without the first.
const char* kDebate = R"yaml(
name: debate
inputs: {problem: string}
sampling: {temperature: 0.7, max_tokens: 8, seed: 42}
steps:
  - decode: {as: "answer[0][i]", for: "i in range(3)", header: "Problem: {{ problem }}\nAgent {{ i }}: ", seed: "42 + i"}
  - decode:
      as: "answer[1][i]"
      for: "i in range(3)"
      header: "\nAgent {{ i }}, again: "
      parents: ["answer[0][j] for j in range(3) if j != i"]
      seed: "142 + i"
  - decode: {as: recap, header: "\nIn short,", parents: ["answer[0][0]"]}
output: "{{ recap }}"
)yaml";

const exec::MessageRecord& decode_named(const exec::RunResult& r, const std::string& name) {
  for (const exec::MessageRecord& m : r.messages)
    if (m.kind == "decode" && m.name == name) return m;
  FAIL("no decode ", name);
  throw;
}

/// softmax in float64, written out here as the reference.
std::vector<double> softmax64(const std::vector<float>& logits) {
  double top = logits[0];
  for (float x : logits) top = std::max(top, double(x));
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp(double(logits[i]) - top);
  for (double& x : p) x /= sum;
  return p;
}

TEST_CASE(
    "quality: reads out of prefix give KL above 0 and reads of a prefix 0 - KL matches a float64 "
    "recomputation") {
  const model::Model& model = *testing::smollm2().model;
  const dsl::Workflow workflow = dsl::parse_workflow(kDebate, "debate.yaml");
  const exec::RunArguments args{{{"problem", "What is 12 times 7?"}}, {}};
  EnginePair e(model);
  const exec::RunResult baseline = eval::run_baseline(workflow, e.baseline->engine(), args);
  int n_unforced = 0;
  const exec::RunResult forced =
      eval::run_teacher_forced(workflow, e.choreo->engine(), args, baseline, n_unforced);
  CHECK(n_unforced == 0);
  const std::vector<eval::CallQuality> calls = eval::compare_calls(baseline, forced);
  REQUIRE(calls.size() == 7);
  for (const eval::CallQuality& c : calls) {
    CAPTURE(c.call);
    REQUIRE(c.n_positions == 8);
    const exec::MessageRecord& b = decode_named(baseline, c.call);
    CHECK(decode_named(forced, c.call).tokens == b.tokens);  // teacher-forced to the baseline's tokens
    if (c.step == "answer[1][*]") {
      CHECK(c.kl() > 0.0);
      CHECK(c.computed < c.baseline_computed);  // the other agents' answers are read from the cache
    } else {
      CHECK(c.kl_sum == 0.0);  // round 0 and recap read a prefix: bit-identical distributions
      CHECK(c.rank_sum == c.exact_rank_sum);
      CHECK(c.n_agree == c.n_agree_exact);
    }
  }
  // answer[1][2], recomputed from the two runs' logits in float64.
  const eval::CallQuality& c = calls[5];
  REQUIRE(c.call == "answer[1][2]");
  const exec::MessageRecord& b = decode_named(baseline, c.call);
  const exec::MessageRecord& f = decode_named(forced, c.call);
  REQUIRE(b.logits.size() == 8);
  REQUIRE(f.logits.size() == 8);
  double kl = 0, rank = 0;
  int agree = 0;
  for (size_t t = 0; t < 8; ++t) {
    const std::vector<double> p = softmax64(b.logits[t]), q = softmax64(f.logits[t]);
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0) kl += p[i] * std::log(p[i] / q[i]) / 8;
    const Token token = b.tokens[b.tokens.size() - 8 + t];
    size_t top = 0, above = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      if (q[i] > q[top]) top = i;
      above += f.logits[t][i] > f.logits[t][size_t(token)];
    }
    rank += double(1 + above) / 8;
    agree += top == size_t(token);
  }
  MESSAGE("answer[1][2]: KL ", c.kl(), " nats, float64 recomputation ", kl);
  CHECK(kl > 1e-6);
  CHECK(c.kl() == doctest::Approx(kl).epsilon(1e-9));
  CHECK(c.rank() == doctest::Approx(rank));
  CHECK(c.n_agree == agree);
}

TEST_CASE("quality: madpar.yaml on F32 weights - round 0 differs from the baseline by float rounding only") {
  // Round 0 reads `start`, a static message the baseline encodes inside each call's flat prompt: the same
  // tokens at the same positions, its attention sums grouped differently. Later rounds read other agents'
  // answers out of prefix.
  std::ifstream in(testing::require_file(testing::workflow_source_dir() / "workflows" / "madpar.yaml"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("max_tokens: 512");
  REQUIRE(at != std::string::npos);
  text.replace(at, 15, "max_tokens: 8");
  const dsl::Workflow workflow = dsl::parse_workflow(text, "madpar.yaml");
  const eval::QualityInstance q =
      compare(*testing::stories260k().model, workflow, {{{"problem", "What is 2 + 3?"}}, {}});
  const eval::VariantQuality s = eval::summarize_variant({q}, 0, "choreo", "madpar");
  REQUIRE(s.steps.size() == 3);
  CHECK(s.steps[0].label == "answer[0][*]");
  CHECK(s.steps[0].n_positions == 24);
  MESSAGE("madpar on stories260K, KL per round: ", s.steps[0].kl.mean, ", ", s.steps[1].kl.mean, ", ",
          s.steps[2].kl.mean);
  CHECK(s.steps[0].kl.mean < 1e-9);
  CHECK(s.steps[1].kl.mean > 1e3 * s.steps[0].kl.mean);
  CHECK(s.steps[2].kl.mean > 1e3 * s.steps[0].kl.mean);
}

TEST_CASE(
    "quality: steps and workflow are position-weighted within an instance and then averaged over instances") {
  const auto call = [](std::string step, int n, double kl_sum, int agree, int computed) {
    eval::CallQuality c;
    c.call = step + "-call";
    c.step = step;
    c.n_positions = n;
    c.kl_sum = kl_sum;
    c.kl_max = kl_sum;
    c.rank_sum = n;
    c.exact_rank_sum = n;
    c.n_agree = agree;
    c.n_agree_exact = n;
    c.baseline_computed = 2 * computed;
    c.computed = computed;
    return c;
  };
  std::vector<eval::QualityInstance> instances(2);
  instances[0].variants = {
      {{call("s", 2, 0.2, 2, 10), call("s", 6, 0.2, 3, 10), call("t", 4, 0.0, 4, 5)}, 40, 0}};
  instances[0].baseline_computed = 70;
  instances[1].variants = {{{call("s", 4, 1.2, 4, 10), call("t", 4, 0.4, 2, 5)}, 30, 1}};
  instances[1].baseline_computed = 50;
  const eval::VariantQuality q = eval::summarize_variant(instances, 0, "choreo", "wf");
  REQUIRE(q.steps.size() == 2);
  CHECK(q.steps[0].label == "s");
  // Step s: instance 0 has 0.4 nats over 8 positions (0.05), instance 1 1.2 over 4 (0.3).
  CHECK(q.steps[0].kl.mean == doctest::Approx((0.05 + 0.3) / 2));
  CHECK(q.steps[0].agreement.mean == doctest::Approx((5.0 / 8 + 1.0) / 2));
  CHECK(q.steps[0].n_positions == 12);
  CHECK(q.steps[0].computed == doctest::Approx((20 + 10) / 2.0));
  CHECK(q.steps[0].kl.low <= q.steps[0].kl.mean);
  CHECK(q.steps[0].kl.high >= q.steps[0].kl.mean);
  CHECK(q.workflow.kl.mean == doctest::Approx((0.4 / 12 + 1.6 / 8) / 2));
  CHECK(q.workflow.computed == doctest::Approx(35.0));  // the whole runs' counts
  CHECK(q.workflow.baseline_computed == doctest::Approx(60.0));
  CHECK(q.workflow.kl_max == doctest::Approx(1.2));
  CHECK(q.n_unforced == 1);
  // Seeded: the same intervals every time.
  const eval::VariantQuality again = eval::summarize_variant(instances, 0, "choreo", "wf");
  CHECK(again.workflow.kl.low == q.workflow.kl.low);
  CHECK(again.workflow.kl.high == q.workflow.kl.high);
}

TEST_CASE("quality: a token's rank counts the strictly larger logits") {
  const std::vector<float> logits{1.0f, 3.0f, 3.0f, -2.0f};
  CHECK(eval::token_rank(logits, 1) == 1);
  CHECK(eval::token_rank(logits, 2) == 1);  // tied with the top
  CHECK(eval::token_rank(logits, 0) == 3);
  CHECK(eval::token_rank(logits, 3) == 4);
  CHECK(eval::kl_divergence(logits, logits) == 0.0);
}

}  // namespace
}  // namespace choreo
