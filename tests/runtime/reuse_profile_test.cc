// The reuse profiler's parts (runtime/eval/reuse_profile.h) and what it relies on in the engine: teacher-forced
// decodes, plans changed on a live engine, E caches at several layers. The profiler must find the layers an
// adapter touches: with a synthetic adapter on layers 10-14 only, a plan that recomputes none of them reads
// exactly the sender's KV, and the cheapest exact plan is [10, L) (layers after 14 see the adapter's effect
// through the residual stream). One transition beats the same number of individually best layers there
// (DroidSpeak Fig. 11).

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/engine/engine.h"
#include "runtime/eval/reuse_profile.h"
#include "runtime/eval/reuse_report.h"
#include "runtime/model/lora.h"
#include "runtime/model/synth_lora.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using runtime::CrossModelPlan;
using Kind = CrossModelPlan::Kind;

eval::Dataset small_dataset() {
  eval::Dataset d;
  d.path = "inline";
  d.metric = eval::Metric::qa_f1;
  const char* passages[][3] = {
      {"Lake Vostok", "Lake Vostok is the largest subglacial lake in Antarctica. It lies under the Russian Vostok "
                      "Station, about four kilometres below the surface of the ice sheet.",
       "Under which station does Lake Vostok lie?"},
      {"Marie Curie", "Marie Curie was a physicist and chemist who was born in Warsaw. She won the Nobel Prize in "
                      "Physics in 1903 and the Nobel Prize in Chemistry in 1911.",
       "In which city was Marie Curie born?"},
  };
  int line = 1;
  for (const auto& p : passages) {
    eval::Row row;
    row.id = p[0];
    row.line = line++;
    row.fields["context"] = std::string(p[0]) + "\n" + p[1];
    row.fields["question"] = p[2];
    row.gold = {row.id == "Lake Vostok" ? "Vostok Station" : "Warsaw"};
    d.rows.push_back(row);
  }
  return d;
}

/// Adds the base model with a synthetic adapter on layers [first, end) to `set`; returns its index.
int add_synthetic_sibling(runtime::ModelSet& set, const testing::ScratchDir& dir, int first, int end, float strength) {
  const model::Model& m = *set.base().weights;
  model::SynthLoraSpec spec;
  spec.first_layer = first;
  spec.end_layer = end;
  spec.strength = strength;
  const std::string path = (dir.path / fmt::format("synth-{}-{}.gguf", first, end)).string();
  model::write_synthetic_lora(m, spec, path);
  return set.add("sibling", m, model::LoraStack{{{model::LoraAdapter::load(path, m), 1.0f}}});
}

TEST_CASE("reuse profile: a decode forced to its own greedy tokens gives those tokens and the same logits, bit for bit") {
  const model::Model& m = *testing::smollm2().model;
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(64) << 20);
  runtime::Engine engine(m, pool);
  runtime::PrefillRequest p;
  p.tokens = m.vocab().tokenize("The capital of France is a city called", false, true);
  const kv::MessageId q = engine.prefill(p).id;
  runtime::DecodeRequest greedy;
  greedy.header = m.vocab().tokenize(" the", false, true);
  greedy.parents = {{q}};
  greedy.max_tokens = 8;
  greedy.sampling.temperature = 0;
  greedy.record_logits = true;
  const runtime::DecodeResult a = engine.decode(greedy);
  runtime::DecodeRequest forced = greedy;
  forced.forced = a.generated;
  const runtime::DecodeResult b = engine.decode(forced);
  CHECK(b.generated == a.generated);
  REQUIRE(b.logits.size() == a.logits.size());
  for (size_t t = 0; t < a.logits.size(); ++t) CHECK(b.logits[t] == a.logits[t]);
  // Forcing other tokens: the logits at the first step are the same, then they follow the forced text.
  forced.forced = m.vocab().tokenize(" Berlin, which is", false, false);
  const runtime::DecodeResult c = engine.decode(forced);
  CHECK(c.generated == forced.forced);
  CHECK(c.logits.front() == a.logits.front());
  CHECK(c.stop_reason == "length");
  CHECK(eval::mean_kl(a.logits, a.logits) == 0.0);
  CHECK(eval::mean_kl(a.logits, c.logits) > 0.0);
}

TEST_CASE("reuse profile: mean_kl is KL(p || q) of the softmaxes, averaged over rows") {
  const std::vector<std::vector<float>> p{{0.0f, 0.0f}, {std::log(3.0f), 0.0f}};
  const std::vector<std::vector<float>> q{{std::log(3.0f), 0.0f}, {std::log(3.0f), 0.0f}};
  // Row 0: p = (1/2, 1/2), q = (3/4, 1/4); row 1: identical.
  const double row0 = 0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25);
  CHECK(eval::mean_kl(p, q) == doctest::Approx(row0 / 2).epsilon(1e-6));
}

TEST_CASE("reuse profile: the sweep's grid and the critical-layer plan") {
  const std::vector<CrossModelPlan> all = eval::sweep_plans(30, 1, 0);
  CHECK(all.size() == 30 * 31 / 2 - 1);  // every [s, e) but [0, 30)
  const std::vector<CrossModelPlan> grid = eval::sweep_plans(30, 5, 0);
  CHECK(grid.size() == 7 * 6 / 2 - 1);
  for (const CrossModelPlan& p : grid) {
    CHECK(p.ranges[0].begin % 5 == 0);
    CHECK((p.ranges[0].end % 5 == 0));
  }
  CHECK(eval::sweep_plans(30, 7, 0).back().ranges[0].end == 30);  // the last layer is always an end
  for (const CrossModelPlan& p : eval::sweep_plans(30, 1, 4)) CHECK(p.ranges[0].end - p.ranges[0].begin <= 4);
  std::vector<double> single(10, 1.0);
  single[2] = 0.1;
  single[3] = 0.2;
  single[7] = 0.3;
  single[5] = NAN;
  const CrossModelPlan critical = eval::critical_layers_plan(single, 4);
  CHECK(critical.describe() == "partial [0, 1) [2, 4) [7, 8)");  // ties go to the lower layer
  CHECK(eval::critical_layers_plan(single, 2).describe() == "partial [2, 4)");
}

TEST_CASE("reuse profile: plans run one after another on a live engine give what each gives alone, from saved or recomputed E caches") {
  const model::Model& m = *testing::smollm2().model;
  testing::ScratchDir dir;
  runtime::ModelSet set(m);
  const int sibling = add_synthetic_sibling(set, dir, 8, 20, 0.1f);
  const eval::Dataset data = small_dataset();
  const std::vector<eval::ReuseItem> items = eval::reuse_items(data, m, 0);
  runtime::EngineOptions pool;
  pool.t0_bytes = size_t(128) << 20;
  const std::vector<CrossModelPlan> plans{CrossModelPlan::partial(8, 14), {Kind::Reuse, {}},
                                          {Kind::Partial, {{4, 6}, {12, 20}}}, CrossModelPlan::partial(0, 30)};
  runtime::ModelSet with_caches = set;
  with_caches.save_e_caches(0, {0, 4, 8, 12});
  eval::ReuseRunner live(with_caches, 0, sibling, pool, data.metric, 6);
  const eval::PlanRun reference = live.start(items[0]);
  for (const CrossModelPlan& plan : plans) {
    CAPTURE(plan.describe());
    const eval::PlanRun a = live.run(plan);
    CHECK(a.n_e_recomputed == 0);
    // A runner that runs this plan alone, without E caches saved: its sender recomputes them.
    runtime::EngineOptions fresh_pool;
  fresh_pool.t0_bytes = size_t(64) << 20;
    eval::ReuseRunner fresh(set, 0, sibling, fresh_pool, data.metric, 6);
    fresh.start(items[0]);
    const eval::PlanRun b = fresh.run(plan);
    CHECK((b.n_e_recomputed > 0) == (plan.kind == Kind::Partial));
    CHECK(a.text == b.text);
    CHECK(a.kl == b.kl);
  }
  // partial [0, L) is recompute: the reference's own answer, KL 0.
  const eval::PlanRun full = live.run(CrossModelPlan::partial(0, 30));
  CHECK(full.text == reference.text);
  CHECK(full.kl == 0.0);
  CHECK(full.token_f1 == 1.0);
}

TEST_CASE(
    "reuse profile: with an adapter on layers 10-14, the cheapest exact plan recomputes 10..L, and one "
    "transition beats the critical layers") {
  const model::Model& m = *testing::smollm2().model;
  const int n_layers = m.config().n_layers;
  testing::ScratchDir dir;
  runtime::ModelSet set(m);
  const int sibling = add_synthetic_sibling(set, dir, 10, 15, 0.2f);
  std::vector<int> every;
  for (int l = 0; l < n_layers; ++l) every.push_back(l);
  set.save_e_caches(0, every);
  const eval::Dataset data = small_dataset();
  std::vector<eval::ReuseItem> items = eval::reuse_items(data, m, 0);
  items.resize(1);  // one item is enough for properties that hold bit for bit on each
  runtime::EngineOptions pool;
  pool.t0_bytes = size_t(256) << 20;
  eval::ReuseRunner runner(set, 0, sibling, pool, data.metric, 6);

  std::vector<CrossModelPlan> plans{{Kind::Reuse, {}}};
  for (const CrossModelPlan& p : eval::sweep_plans(n_layers, 5, 0)) plans.push_back(p);
  for (int l = 0; l < n_layers; ++l) plans.push_back(CrossModelPlan::partial(l, l + 1));
  std::vector<eval::PlanScore> scores(plans.size() + 1);
  scores[0].ranges = {{0, n_layers}};
  for (size_t k = 0; k < plans.size(); ++k)
    scores[k + 1].ranges = plans[k].ranges;
  const auto touches_adapter = [](const CrossModelPlan& p) {
    for (const runtime::LayerRange& r : p.ranges)
      if (r.begin < 15 && r.end > 10) return true;
    return false;
  };
  for (const eval::ReuseItem& item : items) {
    CAPTURE(item.id);
    runner.start(item);
    scores[0].n++;
    const eval::PlanRun reuse = runner.run(plans[0]);
    CHECK(reuse.kl > 0.0);  // the adapter changes what the sibling computes
    for (size_t k = 0; k < plans.size(); ++k) {
      CAPTURE(plans[k].describe());
      const eval::PlanRun r = k == 0 ? reuse : runner.run(plans[k]);
      CHECK(r.n_e_recomputed == 0);
      eval::PlanScore& s = scores[k + 1];
      s.kl += r.kl / double(items.size());
      s.token_f1 += r.token_f1 / double(items.size());
      s.n++;
      // Layers the adapter does not touch, run from the sender's hidden state, give the sender's KV.
      if (!touches_adapter(plans[k])) CHECK(r.kl == reuse.kl);
      // From layer 10 (or before) to the last: exactly what the sibling computes itself.
      if (plans[k].ranges.size() == 1 && plans[k].ranges[0].begin <= 10 && plans[k].ranges[0].end == n_layers)
        CHECK(r.kl == 0.0);
    }
  }
  scores[0].token_f1 = 1.0;
  std::vector<double> losses;
  for (const eval::PlanScore& s : scores) losses.push_back(eval::quality_loss(eval::Quality::kl, s, scores[0]));
  const std::optional<size_t> chosen = eval::choose_plan(scores, losses, 0.0);
  REQUIRE(chosen);
  CHECK(eval::describe_plan(scores[*chosen].ranges, n_layers) == "partial [10, 30)");

  // DroidSpeak Fig. 11: the same number of layers, chosen one by one as the most useful, does worse.
  std::vector<double> single(size_t(n_layers), NAN);
  for (size_t k = 0; k < plans.size(); ++k)
    if (plans[k].ranges.size() == 1 && plans[k].ranges[0].end == plans[k].ranges[0].begin + 1 &&
        plans[k].kind == Kind::Partial)
      single[size_t(plans[k].ranges[0].begin)] = losses[k + 1];
  const CrossModelPlan critical = eval::critical_layers_plan(single, eval::recomputed_layers(scores[*chosen]));
  CAPTURE(critical.describe());
  CHECK(critical.recomputed_layers(n_layers) == n_layers - 10);
  double critical_kl = 0;
  for (const eval::ReuseItem& item : items) {
    runner.start(item);
    critical_kl += runner.run(critical).kl / double(items.size());
  }
  CHECK(critical_kl > losses[*chosen]);
}

}  // namespace
}  // namespace choreo
