#pragma once
// `choreo profile reuse` (docs/profile.md, "Reuse plans"; DESIGN.md §6): sweeps cross-model plans for one
// (sender, receiver) pair on a dataset's training split, scores each against recompute (ReuseRunner), chooses
// the cheapest plan within a loss budget, checks it on the held-out split, and writes the log (runs.jsonl,
// which --resume continues), every plan's scores, the Pareto frontier, the heatmap and the plan file.

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/model_set.h"
#include "runtime/engine/open_engine.h"
#include "runtime/eval/reuse_report.h"

namespace choreo::eval {

/// How far a sweep is: one item of a split scored.
struct ReuseSweepProgress {
  std::string_view split;        // "train" or "held_out"
  size_t item = 0, n_items = 0;  // item is 1-based
  std::string_view item_id;
  size_t n_plans = 0;     // the item's plans, recompute included
  double seconds = 0;     // since the split's scoring began
  bool from_log = false;  // every run of the item came from the log
};

/// What run_reuse_sweep sweeps, on what, and where it writes.
struct ReuseSweepOptions {
  /// The base model and its adapters: the model `default` names, and the one adapters are applied over.
  runtime::ModelOptions models;
  /// Each `default`, an adapter GGUF (`general.type = adapter`) over the base model at its scale, or another
  /// GGUF of the base model's architecture.
  std::string sender = "default", receiver;
  double sender_scale = 1, receiver_scale = 1;
  std::string data_path;  // MuSiQue or LongBench rows (context and question)
  std::string out_dir;    // created; holds runs.jsonl, plans.json, frontier.json, plan.json and the SVGs
  runtime::EngineOptions engine;  // each item's engine (opened in choreo mode)
  Quality quality = Quality::f1;
  double max_loss = 0.05;     // the chosen plan is the cheapest whose training loss is at most this
  int split_percent = 50;     // of the items, the training split (1 to 99)
  int limit = 20;             // items used from the data (0: all)
  int step = 1;               // the sweep's layer grid (sweep_plans)
  int max_span = 0;           // the sweep's longest range (0: any)
  int max_tokens = 16;        // of each greedy answer
  int context_tokens = 1024;  // passage tokens per item (0: all)
  /// Also score the chosen number of layers as the individually best single layers (DroidSpeak Fig. 11).
  bool critical = false;
  bool resume = false;  // continue the log in out_dir; without it, an existing log is an InputError
  std::function<void(size_t n_runs)> on_resume;  // when resuming, the runs read from the log
  std::function<void(const ReuseSweepProgress&)> on_item;
};

/// What a sweep found. Scores are means over a split's items; each list starts with recompute's.
struct ReuseSweep {
  int n_layers = 0;
  size_t n_train = 0, n_held_out = 0;
  std::vector<PlanScore> scores;  // training split: recompute, reuse, then the swept ranges
  std::vector<double> losses;     // of `scores`, under the options' quality
  std::vector<size_t> frontier;   // pareto_frontier of `scores`
  std::optional<size_t> chosen;   // choose_plan of `scores`; none: recompute
  runtime::CrossModelPlan chosen_plan;
  /// With `critical`, when the chosen plan is one range: as many layers, the individually best ones, and its
  /// training scores (recompute's first).
  std::optional<runtime::CrossModelPlan> critical_plan;
  std::vector<PlanScore> critical_train;
  /// Held-out split: recompute, the chosen plan (unless it is recompute), reuse (unless chosen), the critical
  /// layers' plan (when made).
  std::vector<PlanScore> held_out;
};

/// Runs the sweep (loading the models and the dataset), writes its files, and returns what it found.
/// InputError for bad options, data or models, and for a log of other settings.
ReuseSweep run_reuse_sweep(const ReuseSweepOptions& options);

}  // namespace choreo::eval
