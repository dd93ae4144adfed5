// `choreo profile quality`: how far choreo mode is from the exact baseline on a workflow's instances. Each
// instance runs in prefix mode, then in choreo mode teacher-forced to the baseline's tokens; prints, per
// call, step and workflow, the KL divergence of choreo's next-token distributions from the baseline's, the
// rank of the baseline's token, greedy agreement and tokens computed (docs/profile.md, "How far from exact").

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include <unistd.h>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "runtime/eval/quality_profile.h"
#include "runtime/eval/repair_sweep.h"

namespace choreo::cli {

namespace {

struct QualityFlags {
  std::string workflow_path;
  eval::QualityOptions options;
  std::vector<std::string> inputs, params, maps;
  EngineFlags engine;
  int64_t max_steps = dsl::kDefaultMaxSteps;
  bool sweep = false;
  std::string finetuned;
  std::string out_dir;
  std::optional<double> max_kl;
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

void print_time(const eval::VariantQuality& q) {
  if (q.ttft_speedup.empty()) return;
  const auto [lo, hi] = std::minmax_element(q.ttft_speedup.begin(), q.ttft_speedup.end());
  const auto [e_lo, e_hi] = std::minmax_element(q.e2e_speedup.begin(), q.e2e_speedup.end());
  fmt::print(
      "time per instance (teacher-forced, cold): TTFT {:.1f} ms (baseline {:.1f}; speed-up per round "
      "{:.2f}-{:.2f}x), end-to-end {:.1f} ms (baseline {:.1f}; {:.2f}-{:.2f}x)\n",
      q.ttft_ms, q.baseline_ttft_ms, *lo, *hi, q.e2e_ms, q.baseline_e2e_ms, *e_lo, *e_hi);
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
    print_time(q);
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
  // --repair POLICY: two compared runs, without repair and with POLICY, whatever the workflow's `repair:`;
  // --sweep: one per policy of the sweep.
  if (f.sweep) {
    // -o DIR is made when the sweep's files are written (a failed run leaves nothing), so it is checked
    // now: an existing directory we can write into, or one whose nearest existing ancestor is.
    if (!f.out_dir.empty()) {
      std::error_code error;
      std::filesystem::path existing = std::filesystem::absolute(f.out_dir, error);
      while (!error && !std::filesystem::exists(existing, error) && existing.has_relative_path())
        existing = existing.parent_path();
      if (error || !std::filesystem::is_directory(existing, error) || ::access(existing.c_str(), W_OK) != 0)
        throw InputError(fmt::format("-o {}: cannot make the directory ('{}' is not a writable directory)",
                                     f.out_dir, existing.string()),
                         "give a directory that can be created, or an existing one");
      if (std::filesystem::exists(f.out_dir, error))
        check_writable((std::filesystem::path(f.out_dir) / "sweep.md").string(), "-o");
    }
    o.variants = eval::policy_variants(eval::sweep_policies());
  } else if (!f.finetuned.empty()) {
    const RepairPolicy policy = std::exchange(o.engine.repair, std::nullopt).value_or(RepairPolicy{});
    o.variants = eval::finetune_variants({f.finetuned, 1.0f}, policy);
  } else if (o.engine.repair) {
    o.variants = eval::repair_variants(*std::exchange(o.engine.repair, std::nullopt));
  }
  o.on_instance = print_progress;
  const eval::QualityProfile profile = eval::profile_quality(workflow, o);
  if (!f.sweep) return print_quality(profile);
  const eval::RepairSweep sweep = eval::summarize_sweep(profile, o.rounds, f.max_kl);
  fmt::print("{}", eval::sweep_table(sweep));
  if (!f.out_dir.empty()) {
    eval::write_sweep(sweep, profile, f.out_dir);
    fmt::print("wrote {}/: sweep.md, sweep.json, pareto_computed.svg, pareto_ttft.svg{}\n", f.out_dir,
               sweep.chosen ? ", repair.json (choreo run --repair " + f.out_dir + "/repair.json)" : "");
  }
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
  cmd->add_option("--rounds", f->options.rounds,
                  "run each instance this many times, taking turns between the baseline and the compared "
                  "runs, for time (the first round is also compared)")
      ->check(CLI::Range(1, 1000));
  CLI::Option* sweep = cmd->add_flag(
      "--sweep", f->sweep,
      "compare the repair policies none, first:{1,4,16,64} and select:{0.05,0.15,0.3}: a table of KL, tokens "
      "computed and time, the Pareto frontier, and the cheapest policy under --max-kl");
  cmd->add_option("--max-kl", f->max_kl,
                  "with --sweep: the KL bound the chosen policy must meet (default: half of none's KL)")
      ->check(CLI::NonNegativeNumber)
      ->needs(sweep);
  cmd->add_option("-o,--out", f->out_dir,
                  "with --sweep: write sweep.md, sweep.json, pareto_computed.svg, pareto_ttft.svg and the chosen "
                  "policy (repair.json, which `choreo run --repair DIR/repair.json` reads) into this directory")
      ->needs(sweep);
  sweep->excludes(cmd->get_option("--repair"));
  cmd->add_option("--finetuned", f->finetuned,
                  "compare choreo mode with this adapter (from `choreo finetune`) over the run's model against "
                  "the model's own exact baseline: none, adapter, and with --repair POLICY also POLICY and "
                  "adapter+POLICY")
      ->check(CLI::ExistingFile)
      ->excludes(sweep);
  cmd->callback([f] { run_quality(*f); });
}

}  // namespace choreo::cli
