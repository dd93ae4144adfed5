// `choreo profile reuse`: sweeps DroidSpeak cross-model plans for one (sender, receiver) pair on a dataset's
// training split, scores each against recompute, writes the heatmap, the Pareto frontier and a plan file, and
// checks the chosen plan on the held-out split (docs/profile.md, "Reuse plans").

#include <fmt/format.h>

#include <cstdio>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "runtime/eval/reuse_report.h"
#include "runtime/eval/reuse_sweep.h"

namespace choreo::cli {

namespace {

struct ReuseOptions {
  eval::ReuseSweepOptions sweep;
  std::string quality = "f1";
  EngineFlags engine;
};

void print_score(const char* label, const eval::PlanScore& s, const eval::PlanScore& ref, eval::Quality q,
                 int n_layers) {
  fmt::print("  {:<26} {:>7} {:>8.3f} {:>8.4f} {:>8.3f} {:>10.1f} {:>7.2f}x  {}\n", label,
             eval::recomputed_layers(s), s.token_f1, s.kl, s.metric, s.prefill_ms,
             s.prefill_ms > 0 ? ref.prefill_ms / s.prefill_ms : 0.0,
             fmt::format("{} (loss {:.4f})", eval::describe_plan(s.ranges, n_layers),
                         eval::quality_loss(q, s, ref)));
}

void print_header() {
  fmt::print("  {:<26} {:>7} {:>8} {:>8} {:>8} {:>10} {:>8}  {}\n", "", "layers", "tok-F1", "KL", "metric",
             "TTFT ms", "speedup", "plan");
}

/// The report: the frontier, the critical layers, the held-out check, the files written.
void print_sweep(const eval::ReuseSweepOptions& o, const eval::ReuseSweep& r) {
  const eval::Quality q = o.quality;
  const int n_layers = r.n_layers;
  fmt::print("reuse plans for {} reading {} ({} layers), {} training and {} held-out items of {}\n",
             o.receiver, o.sender, n_layers, r.n_train, r.n_held_out, o.data_path);
  fmt::print("quality: {} loss against recompute; chosen: the cheapest plan within {}\n\n",
             eval::quality_name(q), o.max_loss);
  fmt::print("Pareto frontier (training split):\n");
  print_header();
  for (size_t i : r.frontier)
    print_score(i == r.chosen ? "* chosen" : "", r.scores[i], r.scores[0], q, n_layers);
  if (r.critical_plan) {
    fmt::print("\ncritical layers (the {} best single layers, training split):\n",
               r.chosen_plan.recomputed_layers(n_layers));
    print_header();
    print_score("one range (chosen)", r.scores[*r.chosen], r.scores[0], q, n_layers);
    print_score("critical layers", r.critical_train[1], r.critical_train[0], q, n_layers);
  }
  fmt::print("\nheld-out split:\n");
  print_header();
  print_score("recompute", r.held_out[0], r.held_out[0], q, n_layers);
  for (size_t i = 1; i < r.held_out.size(); ++i)
    print_score(i == 1 && r.chosen_plan.kind != runtime::CrossModelPlan::Kind::Recompute ? "chosen" : "",
                r.held_out[i], r.held_out[0], q, n_layers);
  fmt::print("\nwrote {0}/plan.json, {0}/plans.json, {0}/frontier.json, {0}/heatmap.svg, {0}/frontier.svg\n",
             o.out_dir);
}

void print_progress(const eval::ReuseSweepProgress& p) {
  std::fprintf(stderr, "profile reuse: %.*s %zu/%zu (%.*s, %zu plans)  %.0f s%s\n", int(p.split.size()),
               p.split.data(), p.item, p.n_items, int(p.item_id.size()), p.item_id.data(), p.n_plans,
               p.seconds, p.from_log ? "  (from the log)" : "");
}

void run_reuse(ReuseOptions& o) {
  eval::ReuseSweepOptions& sweep = o.sweep;
  sweep.quality = eval::parse_quality(o.quality);
  sweep.models = o.engine.model_options();
  sweep.engine = o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::None);
  sweep.on_resume = [](size_t n) {
    std::fprintf(stderr, "profile reuse: resuming: %zu runs in the log\n", n);
  };
  sweep.on_item = print_progress;
  print_sweep(sweep, eval::run_reuse_sweep(sweep));
}

}  // namespace

void register_profile_reuse(CLI::App& profile) {
  auto o = std::make_shared<ReuseOptions>();
  CLI::App* cmd = profile.add_subcommand(
      "reuse", "sweep cross-model reuse plans (DroidSpeak) for a sender and a receiver model on a dataset");
  cmd->add_option(
      "--sender", o->sweep.sender,
      "the model that encodes the passages: default (-m with --lora), an adapter GGUF over -m, or "
      "another GGUF of -m's architecture (default: default)");
  cmd->add_option("--receiver", o->sweep.receiver, "the model that answers, reading them (as for --sender)")
      ->required();
  cmd->add_option("--sender-scale", o->sweep.sender_scale, "the sender adapter's scale (default 1)");
  cmd->add_option("--receiver-scale", o->sweep.receiver_scale, "the receiver adapter's scale (default 1)");
  cmd->add_option("--data", o->sweep.data_path,
                  "the dataset: MuSiQue or LongBench rows (context and question)")
      ->required();
  cmd->add_option("-o,--out", o->sweep.out_dir,
                  "directory for runs.jsonl, plans.json, plan.json and the SVGs")
      ->required();
  cmd->add_option("--split", o->sweep.split_percent,
                  "percent of the items that form the training split (default 50)");
  cmd->add_option("--limit", o->sweep.limit, "items to use from --data (default 20; 0 = all)")
      ->check(at_least(0));
  cmd->add_option("--step", o->sweep.step,
                  "the sweep's layer grid: plans [s, e) with s and e multiples of it (default 1)")
      ->check(at_least(1));
  cmd->add_option("--max-span", o->sweep.max_span,
                  "sweep only plans recomputing at most this many layers (0 = any)")
      ->check(at_least(0));
  cmd->add_option("--max-tokens", o->sweep.max_tokens, "tokens of each greedy answer (default 16)")
      ->check(at_least(1));
  cmd->add_option("--context-tokens", o->sweep.context_tokens,
                  "passage tokens per item: the first N (default 1024; 0 = all)")
      ->check(at_least(0));
  cmd->add_option("--quality", o->quality,
                  "what a plan's loss is: f1 (1 - token-F1 against recompute's answers; "
                  "default), kl (mean KL, nats) or metric (drop of the dataset's metric)");
  cmd->add_option("--max-loss", o->sweep.max_loss,
                  "choose the cheapest plan whose loss is at most this (default 0.05)");
  cmd->add_flag(
      "--critical", o->sweep.critical,
      "also score the chosen number of layers as the individually best single layers (DroidSpeak Fig. 11)");
  cmd->add_flag("--resume", o->sweep.resume, "continue the profile whose runs.jsonl is in -o");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache);
  cmd->callback([o] { run_reuse(*o); });
}

}  // namespace choreo::cli
