// `choreo profile quality`: how far choreo mode is from the exact baseline on a workflow's instances. Each
// instance runs in prefix mode, then in choreo mode teacher-forced to the baseline's tokens; prints, per
// call, step and workflow, the KL divergence of choreo's next-token distributions from the baseline's, the
// rank of the baseline's token, greedy agreement and tokens computed (docs/profile.md, "How far from exact").

#include <fmt/format.h>

#include <cstdio>
#include <utility>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "runtime/eval/quality_profile.h"

namespace choreo::cli {

namespace {

struct QualityFlags {
  std::string workflow_path;
  eval::QualityOptions options;
  std::vector<std::string> inputs, params, maps;
  EngineFlags engine;
  int64_t max_steps = dsl::kDefaultMaxSteps;
};

void print_progress(size_t index, size_t count, const eval::QualityInstance& instance) {
  for (const eval::VariantRun& run : instance.variants) {
    eval::CallQuality all;
    for (const eval::CallQuality& c : run.calls) all.add(c);
    std::fprintf(stderr, "profile quality: %zu/%zu (line %d)  %zu calls  KL %.4g  agreement %.3f\n",
                 index + 1, count, instance.line, run.calls.size(), all.kl(), all.agreement());
  }
}

void print_calls(const eval::QualityProfile& p, size_t v) {
  fmt::print("{:>5}  {:<18} {:>4} {:>10} {:>10} {:>13} {:>5} {:>13} {:>13}\n", "line", "call", "pos", "KL",
             "max KL", "rank (exact)", "max", "agree (exact)", "computed b/c");
  for (const eval::QualityInstance& instance : p.instances)
    for (const eval::CallQuality& c : instance.variants[v].calls)
      fmt::print(
          "{:>5}  {:<18} {:>4} {:>10.3g} {:>10.3g} {:>6.2f} ({:.2f}) {:>5} {:>5.3f} ({:.3f}) {:>6}/{:<6}\n",
          instance.line, c.call, c.n_positions, c.kl(), c.kl_max, c.rank(), c.exact_rank(), c.rank_max,
          c.agreement(), c.exact_agreement(), c.baseline_computed, c.computed);
}

void print_summary(const eval::QualitySummary& s) {
  fmt::print("{:<14} pos {:<5} KL {:.3g} [{:.3g}, {:.3g}]  rank {:.2f} [{:.2f}, {:.2f}] (exact {:.2f})  ",
             s.label, s.n_positions, s.kl.mean, s.kl.low, s.kl.high, s.rank.mean, s.rank.low, s.rank.high,
             s.exact_rank.mean);
  fmt::print("agree {:.3f} [{:.3f}, {:.3f}] (exact {:.3f})  computed {:.0f}/{:.0f}\n", s.agreement.mean,
             s.agreement.low, s.agreement.high, s.exact_agreement.mean, s.baseline_computed, s.computed);
}

void print_quality(const eval::QualityProfile& p) {
  fmt::print(
      "{} on {} instance(s), model {}; baseline: prefix mode (exact); compared runs teacher-forced to it\n",
      p.workflow, p.instances.size(), p.model_path);
  for (size_t v = 0; v < p.variants.size(); ++v) {
    const eval::VariantQuality& q = p.variants[v];
    fmt::print(
        "\n{0}: KL(baseline || {0}) per position, nats; rank of the baseline's token under {0}; agree: {0}'s "
        "argmax is that token; (exact): the same figure of the baseline itself\n\n",
        q.name);
    print_calls(p, v);
    fmt::print(
        "\nper step, then the workflow: means over instances [95% bootstrap CI]; computed: per instance\n");
    for (const eval::QualitySummary& s : q.steps) print_summary(s);
    print_summary(q.workflow);
    if (q.n_unforced > 0)
      fmt::print("note: {} decode(s) had no baseline decode of the same name and were not compared\n",
                 q.n_unforced);
  }
}

void run_quality(QualityFlags& f) {
  eval::QualityOptions& o = f.options;
  const dsl::Workflow workflow = dsl::load_workflow(f.workflow_path);
  o.arguments = {key_values(f.inputs, "--input"), key_values(f.params, "--param"), f.max_steps};
  if (!o.inputs_path.empty()) o.input_fields = key_values(f.maps, "--map");
  o.models = f.engine.model_options();
  o.engine = f.engine.engine_options(runtime::Mode::Choreo, StorePolicy::None);
  // --repair POLICY: two compared runs, without repair and with POLICY, whatever the workflow's `repair:`.
  if (o.engine.repair) o.variants = eval::repair_variants(*std::exchange(o.engine.repair, std::nullopt));
  o.on_instance = print_progress;
  print_quality(eval::profile_quality(workflow, o));
}

}  // namespace

void register_profile_quality(CLI::App& profile) {
  auto f = std::make_shared<QualityFlags>();
  CLI::App* cmd = profile.add_subcommand(
      "quality",
      "how far choreo mode is from the exact baseline: KL, rank, agreement per call, step and workflow");
  cmd->add_option("workflow", f->workflow_path, "workflow YAML file")->required();
  add_instance_options(*cmd, f->options.inputs_path, f->options.limit, f->inputs, f->maps, f->params);
  cmd->add_option("--json", f->options.json_path, "write the per-call report as JSON here");
  f->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache |
                          EngineFlags::kRepair);
  add_max_steps_option(*cmd, f->max_steps);
  cmd->callback([f] { run_quality(*f); });
}

}  // namespace choreo::cli
