// `choreo profile`: baseline (prefix-caching chat calls) vs choreo on the same instances, with the choreo run
// forced to generate the baseline's token counts; prints per-step TTFT, end-to-end time, tokens computed vs
// reused, and baseline/choreo ratios with bootstrap intervals (docs/profile.md).

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "runtime/exec/profile.h"

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

/// The progress line of one profiled instance, on stderr.
void print_progress(size_t index, size_t count, const exec::ProfiledInstance& p) {
  const exec::RunTiming& b = p.baseline_timing;
  const exec::RunTiming& c = p.choreo_timing;
  std::fprintf(stderr, "profile: %zu/%zu  TTFT %.0f → %.0f ms (%.2fx)  end-to-end %.0f → %.0f ms (%.2fx)\n",
               index + 1, count, b.ttft_ms, c.ttft_ms, c.ttft_ms > 0 ? b.ttft_ms / c.ttft_ms : 0.0, b.e2e_ms,
               c.e2e_ms, c.e2e_ms > 0 ? b.e2e_ms / c.e2e_ms : 0.0);
}

/// The per-step table and the totals.
void print_profile(const exec::WorkflowProfile& p) {
  fmt::print(
      "{} on {} instance(s), model {}; baseline = {} mode, choreo forced to the baseline's token counts\n\n",
      p.workflow, p.instances.size(), p.model_path, runtime::mode_name(p.baseline_mode));
  fmt::print("{:<22} {:>5} {:>13} {:>13} {:>8} {:>19} {:>19}\n", "step (mean/instance)", "n", "base TTFT ms",
             "choreo TTFT", "ratio", "computed base/chor", "reused base/chor");
  for (const exec::StepSummary& s : p.steps) {
    const double k = s.n;
    fmt::print("{:<22} {:>5} {:>13.1f} {:>13.1f} {:>7.2f}x {:>9.0f}/{:<9.0f} {:>9.0f}/{:<9.0f}\n", s.label,
               s.n, s.baseline_ttft_ms / k, s.choreo_ttft_ms / k,
               s.choreo_ttft_ms > 0 ? s.baseline_ttft_ms / s.choreo_ttft_ms : 0.0, s.baseline_computed / k,
               s.choreo_computed / k, s.baseline_reused / k, s.choreo_reused / k);
  }
  const exec::ProfileMeans& m = p.means;
  fmt::print(
      "\nworkflow TTFT (sum of decode steps): baseline {:.1f} ms, choreo {:.1f} ms, ratio {:.2f}x "
      "[95% CI {:.2f}, {:.2f}]\n",
      m.baseline_ttft_ms, m.choreo_ttft_ms, p.ttft.ratio, p.ttft.low, p.ttft.high);
  fmt::print(
      "end-to-end:                          baseline {:.1f} ms, choreo {:.1f} ms, ratio {:.2f}x "
      "[95% CI {:.2f}, {:.2f}]\n",
      m.baseline_e2e_ms, m.choreo_e2e_ms, p.e2e.ratio, p.e2e.low, p.e2e.high);
  fmt::print(
      "tokens per instance: computed {:.0f} vs {:.0f}, reused {:.0f} vs {:.0f}, generated {:.0f} (both)\n",
      m.baseline_computed, m.choreo_computed, m.baseline_reused, m.choreo_reused, m.generated);
  if (p.n_unforced > 0)
    fmt::print(
        "note: {} choreo decode(s) had no baseline decode of the same name (control flow diverged) and "
        "were not forced\n",
        p.n_unforced);
}

void run_profile(const ProfileOptions& o) {
  exec::WorkflowProfileOptions options;
  options.baseline_mode = runtime::parse_mode(o.baseline);
  const dsl::Workflow workflow = dsl::load_workflow(o.workflow_path);
  options.arguments = {key_values(o.inputs, "--input"), key_values(o.params, "--param"), o.max_steps};
  options.inputs_path = o.inputs_path;
  if (!o.inputs_path.empty()) options.input_fields = key_values(o.maps, "--map");
  options.limit = o.limit;
  options.models = o.engine.model_options();
  options.engine = o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::None);
  options.cold = o.cold;
  options.json_path = o.json_path;
  options.on_instance = print_progress;
  print_profile(exec::profile_workflow(workflow, options));
}

}  // namespace

void register_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "time a workflow in a chat-API baseline mode vs choreo mode with equal generated tokens; "
      "profile quality: how far choreo's next-token distributions are from the baseline's; "
      "profile reuse: cross-model plans");
  cmd->add_option("workflow", o->workflow_path, "workflow YAML file");
  add_instance_options(*cmd, o->inputs_path, o->limit, o->inputs, o->maps, o->params);
  cmd->add_option("--baseline", o->baseline, "baseline mode: prefix (default) or naive")
      ->check(CLI::IsMember({"prefix", "naive"}));
  cmd->add_option("--json", o->json_path, "write the raw per-instance numbers as JSON here");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache);
  cmd->add_flag("--cold", o->cold,
                "a fresh choreo engine per instance (default: one across instances, so later instances reuse "
                "what earlier ones encoded; the baseline is always fresh per instance)");
  add_max_steps_option(*cmd, o->max_steps);
  register_profile_reuse(*cmd);
  register_profile_quality(*cmd);
  cmd->callback([o, cmd] {
    if (cmd->got_subcommand("reuse") || cmd->got_subcommand("quality")) return;
    if (o->workflow_path.empty())
      throw InputError("choreo profile needs a workflow file",
                       "choreo profile WF.yaml [--inputs ROWS.jsonl], or profile reuse|quality --help");
    run_profile(*o);
  });
}

}  // namespace choreo::cli
