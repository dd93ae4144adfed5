// run_reuse_sweep (runtime/eval/reuse_sweep.h), what `choreo profile reuse` calls, on stories260K with a
// synthetic adapter on layers 2-3 of its 5: the plan it chooses under a zero KL budget is the cheapest exact
// one, [2, 5) (the adapter's layers and every layer after them, which see its effect through the residual
// stream); what it returns is what it wrote; resuming reads every run from the log and finds the same.

#include "runtime/eval/reuse_sweep.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/model/synth_lora.h"
#include "tests/runtime/reuse_data.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Kind = runtime::CrossModelPlan::Kind;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Three MuSiQue-shaped rows, a synthetic adapter on layers [2, 4), and the sweep's options over them.
eval::ReuseSweepOptions small_sweep(const testing::ScratchDir& scratch) {
  eval::ReuseSweepOptions o;
  o.data_path = (scratch.path / "data.json").string();
  testing::write_reuse_data(o.data_path);
  model::SynthLoraSpec spec;
  spec.first_layer = 2;
  spec.end_layer = 4;
  spec.strength = 0.3f;
  o.receiver = (scratch.path / "synth.gguf").string();
  model::write_synthetic_lora(*testing::stories260k().model, spec, o.receiver);
  o.models.path = testing::shared_file("models/stories260K.gguf");
  o.models.n_threads = 2;
  o.out_dir = (scratch.path / "out").string();
  o.quality = eval::Quality::kl;
  o.max_loss = 0;
  o.split_percent = 67;
  o.max_tokens = 6;
  o.context_tokens = 64;
  return o;
}

TEST_CASE("reuse sweep: chooses the cheapest exact plan, returns what it wrote, and resumes from its log") {
  testing::ScratchDir scratch;
  eval::ReuseSweepOptions o = small_sweep(scratch);
  size_t n_progress = 0;
  o.on_item = [&](const eval::ReuseSweepProgress& p) {
    CHECK(!p.from_log);
    CHECK(p.item >= 1);
    CHECK(p.item <= p.n_items);
    ++n_progress;
  };
  const eval::ReuseSweep r = eval::run_reuse_sweep(o);
  CHECK(r.n_layers == 5);
  CHECK(r.n_train == 2);  // 67% of 3
  CHECK(r.n_held_out == 1);
  CHECK(n_progress == 3);  // two training items, one held out
  // Recompute, reuse, and the 14 ranges [s, e) of 5 layers but [0, 5).
  REQUIRE(r.scores.size() == 16);
  REQUIRE(r.losses.size() == r.scores.size());
  CHECK(r.losses[0] == 0.0);  // recompute against itself
  CHECK(r.scores[1].ranges.empty());
  CHECK(r.losses[1] > 0.0);  // reuse reads the base model's KV on the adapted layers: not exact (not vacuous)
  REQUIRE(r.chosen);
  REQUIRE(r.chosen_plan.kind == Kind::Partial);
  REQUIRE(r.chosen_plan.ranges.size() == 1);
  CHECK(r.chosen_plan.ranges[0].begin == 2);
  CHECK(r.chosen_plan.ranges[0].end == 5);
  CHECK(r.losses[*r.chosen] == 0.0);
  // Every cheaper plan (fewer layers recomputed) loses something: the choice is the cheapest within 0.
  for (size_t i = 0; i < r.scores.size(); ++i)
    if (eval::recomputed_layers(r.scores[i]) < 3) CHECK_MESSAGE(r.losses[i] > 0.0, i);
  // Held out: recompute, the chosen plan (exact there too), reuse.
  REQUIRE(r.held_out.size() == 3);
  CHECK(r.held_out[1].kl == 0.0);
  CHECK(!r.critical_plan);  // without `critical`

  // The files say what was returned.
  const json plan = json::parse(slurp(fs::path(o.out_dir) / "plan.json"));
  CHECK(plan["plan"] == "partial");
  CHECK(plan["layers"] == json::parse("[[2, 5]]"));
  CHECK(plan["train"]["n"] == r.n_train);
  CHECK(plan["held_out"]["n"] == r.n_held_out);
  const json plans = json::parse(slurp(fs::path(o.out_dir) / "plans.json"));
  CHECK(plans.size() == r.scores.size());
  CHECK(json::parse(slurp(fs::path(o.out_dir) / "frontier.json")).size() == r.frontier.size());

  // Again without resume: refused, the log unchanged.
  const std::string log = slurp(fs::path(o.out_dir) / "runs.jsonl");
  CHECK_THROWS_AS(eval::run_reuse_sweep(o), InputError);
  CHECK(slurp(fs::path(o.out_dir) / "runs.jsonl") == log);
  // Resumed: every run from the log, the same scores, the log unchanged.
  o.resume = true;
  size_t n_resumed = 0;
  o.on_resume = [&](size_t n) { n_resumed = n; };
  o.on_item = [](const eval::ReuseSweepProgress& p) { CHECK(p.from_log); };
  const eval::ReuseSweep again = eval::run_reuse_sweep(o);
  CHECK(n_resumed == 2 * 16 + 3);  // each training item's 16 plans, the held-out item's 3
  REQUIRE(again.scores.size() == r.scores.size());
  for (size_t i = 0; i < r.scores.size(); ++i) CHECK(again.losses[i] == r.losses[i]);
  CHECK(again.chosen == r.chosen);
  CHECK(slurp(fs::path(o.out_dir) / "runs.jsonl") == log);
}

TEST_CASE("reuse sweep: bad options are InputErrors before the out directory is made") {
  testing::ScratchDir scratch;
  eval::ReuseSweepOptions o = small_sweep(scratch);
  const auto refused = [&](eval::ReuseSweepOptions bad) {
    CHECK_THROWS_AS(eval::run_reuse_sweep(bad), InputError);
    CHECK(!fs::exists(o.out_dir));
  };
  eval::ReuseSweepOptions same = o;
  same.receiver = "default";
  refused(same);
  eval::ReuseSweepOptions budget = o;
  budget.max_loss = -1;
  refused(budget);
  eval::ReuseSweepOptions split = o;
  split.split_percent = 100;
  refused(split);
  eval::ReuseSweepOptions missing = o;
  missing.receiver = (scratch.path / "nope.gguf").string();
  refused(missing);
}

}  // namespace
}  // namespace choreo
