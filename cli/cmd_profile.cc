// `choreo profile`: baseline (prefix-caching chat calls) vs choreo on the same instances, with the choreo run
// forced to generate the baseline's token counts; prints per-step TTFT, end-to-end time, tokens computed vs
// reused, and baseline/choreo ratios with bootstrap intervals (docs/profile.md).

#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "runtime/engine/open_engine.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/statistics.h"
#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/exec/instances.h"
#include "runtime/exec/profile.h"
#include "dsl/plan/elaborate.h"
#include "runtime/kv/page_pool.h"

namespace choreo::cli {

namespace {

struct ProfileOptions {
  std::string workflow_path, inputs_path, json_path, baseline = "prefix";
  std::vector<std::string> inputs, params, maps;
  int limit = 10;
  EngineFlags engine;
  int64_t max_steps = dsl::kDefaultMaxSteps;
  bool cold = false;  // a fresh choreo engine per instance too
};

/// Per-step means over instances, matched by label and order of occurrence.
struct StepSummary {
  std::string label;
  int n = 0;
  double baseline_ttft = 0, choreo_ttft = 0;
  double baseline_computed = 0, choreo_computed = 0, baseline_reused = 0, choreo_reused = 0;
};

nlohmann::ordered_json timing_json(const exec::RunTiming& t) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const exec::StepTiming& s : t.steps)
    steps.push_back({{"step", s.label}, {"size", s.size}, {"ttft_ms", s.ttft_ms}, {"total_ms", s.total_ms},
                     {"computed", s.n_computed}, {"reused", s.n_reused}, {"generated", s.n_generated}});
  return {{"ttft_ms", t.ttft_ms}, {"e2e_ms", t.e2e_ms}, {"computed", t.n_computed}, {"reused", t.n_reused},
          {"generated", t.n_generated}, {"steps", steps}};
}

void run_profile(const ProfileOptions& o) {
  const runtime::Mode baseline_mode = runtime::parse_mode(o.baseline);
  if (baseline_mode == runtime::Mode::Choreo)
    throw InputError("--baseline must be prefix or naive", "the choreo run is the one being measured");
  const dsl::Workflow workflow = dsl::load_workflow(o.workflow_path);
  const exec::RunArguments base{key_values(o.inputs, "--input"), key_values(o.params, "--param"), o.max_steps};
  std::vector<exec::InputRow> rows;
  if (o.inputs_path.empty())
    rows.push_back({0, base});
  else
    rows = exec::read_input_rows(o.inputs_path, workflow, base, key_values(o.maps, "--map"));
  if (o.limit > 0 && int(rows.size()) > o.limit) rows.resize(size_t(o.limit));
  if (!o.json_path.empty()) check_writable(o.json_path, "--json");

  // The run's model (with --lora adapters) is model 0; the workflow's `models:` follow.
  runtime::ModelOptions model_options = o.engine.model_options();
  model_options.add_models = exec::workflow_models_adder(workflow);
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(model_options);
  const model::Model& model = loaded->model();
  // Warm-up (page faults on the weights, thread start), on a scratch engine so neither cache sees it;
  // first, so that the backend is told the --cache-mib budget last (Backend::set_kv_budget).
  runtime::warm_up(loaded->models(), o.engine.page_tokens);
  const runtime::EngineOptions baseline_options = o.engine.engine_options(baseline_mode, StorePolicy::None);
  const runtime::EngineOptions choreo_options = o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::None);

  std::vector<double> b_ttft, c_ttft, b_e2e, c_e2e;
  std::vector<StepSummary> steps;
  nlohmann::ordered_json raw = nlohmann::ordered_json::array();
  int unforced = 0;
  double b_computed = 0, c_computed = 0, b_reused = 0, c_reused = 0, generated = 0;
  // The choreo engine lives across instances (warm: what every row shares is encoded once per run, as in
  // `run --inputs` and `eval`), unless --cold; the baseline gets a fresh engine per instance (cold), as a
  // chat API call that shares nothing with the previous row. KV that outgrows --cache-mib is evicted
  // (docs/store.md, "Tiers"), with the same results.
  std::unique_ptr<runtime::OpenedEngine> warm_choreo;
  if (!o.cold) warm_choreo = runtime::open_engine(loaded, choreo_options);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::unique_ptr<runtime::OpenedEngine> baseline_engine = runtime::open_engine(loaded, baseline_options);
    runtime::Engine& baseline = baseline_engine->engine();
    std::unique_ptr<runtime::OpenedEngine> cold_choreo;
    if (o.cold) cold_choreo = runtime::open_engine(loaded, choreo_options);
    runtime::Engine& choreo = o.cold ? cold_choreo->engine() : warm_choreo->engine();
    exec::ProfiledInstance p;
    try {
      p = exec::profile_instance(workflow, baseline, choreo, rows[i].arguments);
    } catch (...) {
      // --json still gets the instances measured so far, marked incomplete.
      if (!o.json_path.empty()) {
        nlohmann::ordered_json doc = {{"workflow", workflow.name.value}, {"model", model.file().path()},
                                      {"baseline_mode", o.baseline},    {"incomplete", true},
                                      {"error", fmt::format("row at line {}: {}", rows[i].line,
                                                            describe_error(std::current_exception()))},
                                      {"instances", raw}};
        write_file_atomically(o.json_path, doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      }
      throw;
    }
    const exec::RunTiming& b = p.baseline_timing;
    const exec::RunTiming& c = p.choreo_timing;
    std::fprintf(stderr, "profile: %zu/%zu  TTFT %.0f → %.0f ms (%.2fx)  end-to-end %.0f → %.0f ms (%.2fx)\n", i + 1,
                 rows.size(), b.ttft_ms, c.ttft_ms, c.ttft_ms > 0 ? b.ttft_ms / c.ttft_ms : 0.0, b.e2e_ms,
                 c.e2e_ms, c.e2e_ms > 0 ? b.e2e_ms / c.e2e_ms : 0.0);
    b_ttft.push_back(b.ttft_ms);
    c_ttft.push_back(c.ttft_ms);
    b_e2e.push_back(b.e2e_ms);
    c_e2e.push_back(c.e2e_ms);
    b_computed += b.n_computed;
    c_computed += c.n_computed;
    b_reused += b.n_reused;
    c_reused += c.n_reused;
    generated += b.n_generated;
    unforced += p.n_unforced;
    std::map<std::string, int> seen;
    for (const exec::StepTiming& bs : b.steps) {
      const int occurrence = seen[bs.label]++;
      int found = -1;
      for (size_t k = 0, count = 0; k < c.steps.size(); ++k)
        if (c.steps[k].label == bs.label && int(count++) == occurrence) found = int(k);
      if (found < 0) continue;
      const exec::StepTiming& cs = c.steps[size_t(found)];
      auto it = std::find_if(steps.begin(), steps.end(), [&](const StepSummary& s) {
        return s.label == bs.label + (occurrence ? fmt::format(" #{}", occurrence + 1) : "");
      });
      if (it == steps.end()) {
        steps.push_back({bs.label + (occurrence ? fmt::format(" #{}", occurrence + 1) : "")});
        it = steps.end() - 1;
      }
      it->n++;
      it->baseline_ttft += bs.ttft_ms;
      it->choreo_ttft += cs.ttft_ms;
      it->baseline_computed += bs.n_computed;
      it->choreo_computed += cs.n_computed;
      it->baseline_reused += bs.n_reused;
      it->choreo_reused += cs.n_reused;
    }
    raw.push_back({{"line", rows[i].line},
                   {"baseline", timing_json(b)},
                   {"choreo", timing_json(c)},
                   {"unforced_decodes", p.n_unforced},
                   {"baseline_output", p.baseline.output},
                   {"choreo_output", p.choreo.output}});
  }

  const stats::RatioEstimate ttft = stats::bootstrap_ratio(b_ttft, c_ttft);
  const stats::RatioEstimate e2e = stats::bootstrap_ratio(b_e2e, c_e2e);
  const size_t n = rows.size();
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / double(v.size());
  };
  fmt::print("{} on {} instance(s), model {}; baseline = {} mode, choreo forced to the baseline's token counts\n\n",
             workflow.name.value, n, model.file().path(), o.baseline);
  fmt::print("{:<22} {:>5} {:>13} {:>13} {:>8} {:>19} {:>19}\n", "step (mean/instance)", "n", "base TTFT ms",
             "choreo TTFT", "ratio", "computed base/chor", "reused base/chor");
  for (const StepSummary& s : steps) {
    const double k = s.n;
    fmt::print("{:<22} {:>5} {:>13.1f} {:>13.1f} {:>7.2f}x {:>9.0f}/{:<9.0f} {:>9.0f}/{:<9.0f}\n", s.label, s.n,
               s.baseline_ttft / k, s.choreo_ttft / k, s.choreo_ttft > 0 ? s.baseline_ttft / s.choreo_ttft : 0.0,
               s.baseline_computed / k, s.choreo_computed / k, s.baseline_reused / k, s.choreo_reused / k);
  }
  fmt::print("\nworkflow TTFT (sum of decode steps): baseline {:.1f} ms, choreo {:.1f} ms, ratio {:.2f}x "
             "[95% CI {:.2f}, {:.2f}]\n",
             mean(b_ttft), mean(c_ttft), ttft.ratio, ttft.low, ttft.high);
  fmt::print("end-to-end:                          baseline {:.1f} ms, choreo {:.1f} ms, ratio {:.2f}x "
             "[95% CI {:.2f}, {:.2f}]\n",
             mean(b_e2e), mean(c_e2e), e2e.ratio, e2e.low, e2e.high);
  fmt::print("tokens per instance: computed {:.0f} vs {:.0f}, reused {:.0f} vs {:.0f}, generated {:.0f} (both)\n",
             b_computed / double(n), c_computed / double(n), b_reused / double(n), c_reused / double(n),
             generated / double(n));
  if (unforced > 0)
    fmt::print("note: {} choreo decode(s) had no baseline decode of the same name (control flow diverged) and "
               "were not forced\n",
               unforced);
  if (!o.json_path.empty()) {
    nlohmann::ordered_json doc = {{"workflow", workflow.name.value}, {"model", model.file().path()},
                                  {"baseline_mode", o.baseline},    {"instances", raw},
                                  {"ttft_ratio", {{"ratio", ttft.ratio}, {"low", ttft.low}, {"high", ttft.high}}},
                                  {"e2e_ratio", {{"ratio", e2e.ratio}, {"low", e2e.low}, {"high", e2e.high}}}};
    write_file_atomically(o.json_path, doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

void register_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "time a workflow in a chat-API baseline mode vs choreo mode with equal generated tokens");
  cmd->add_option("workflow", o->workflow_path, "workflow YAML file");
  cmd->add_option("--inputs", o->inputs_path, "JSON Lines file, one instance per line (as for choreo run)");
  cmd->add_option("--limit", o->limit, "instances to run from --inputs (default 10; 0 = all)")
      ->check(at_least(0));
  add_pairs_option(*cmd, "--input", o->inputs, "an input value for every instance, KEY=VALUE (repeatable)");
  add_pairs_option(*cmd, "--map", o->maps, "with --inputs: read input INPUT from row key FIELD, INPUT=FIELD (repeatable)");
  add_pairs_option(*cmd, "--param", o->params, "override a param, KEY=VALUE (repeatable)");
  cmd->add_option("--baseline", o->baseline, "baseline mode: prefix (default) or naive")
      ->check(CLI::IsMember({"prefix", "naive"}));
  cmd->add_option("--json", o->json_path, "write the raw per-instance numbers as JSON here");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache);
  cmd->add_flag("--cold", o->cold,
                "a fresh choreo engine per instance (default: one across instances, so later instances reuse "
                "what earlier ones encoded; the baseline is always fresh per instance)");
  add_max_steps_option(*cmd, o->max_steps);
  register_profile_reuse(*cmd);
  cmd->callback([o, cmd] {
    if (cmd->got_subcommand("reuse")) return;
    if (o->workflow_path.empty())
      throw InputError("choreo profile needs a workflow file",
                       "choreo profile WF.yaml [--inputs ROWS.jsonl], or choreo profile reuse --help");
    run_profile(*o);
  });
}

}  // namespace choreo::cli
