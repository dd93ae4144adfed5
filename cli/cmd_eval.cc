// `choreo eval`: the subcommand group for evaluation (docs/eval.md). `score` scores predictions made
// elsewhere; `merge` combines the results files of shards and prints the summary. Neither needs a model.
// The run form (`choreo eval WORKFLOW.yaml --data ...`) attaches to the same group from a sibling file.

#include <cstdio>
#include <iostream>

#include "cli/common.h"
#include "runtime/eval/merge.h"
#include "runtime/eval/metric.h"
#include "runtime/eval/score_file.h"
#include "runtime/eval/summary.h"

namespace choreo::cli {

namespace {

struct ScoreOptions {
  std::string metric, path;
  bool json = false;
};

struct MergeOptions {
  std::vector<std::string> paths;
  std::string out_path;
  bool json = false;
};

void print_summary(const eval::Summary& summary, bool json) {
  if (json)
    std::cout << eval::summary_to_json(summary).dump(2) << "\n";
  else
    std::cout << eval::format_summary(summary);
}

void run_score(const ScoreOptions& o) {
  const eval::Metric metric = eval::parse_metric(o.metric);
  print_summary(eval::summarize(eval::score_file(o.path, metric)), o.json);
}

void run_merge(const MergeOptions& o) {
  eval::Merged merged = eval::merge_results(o.paths);
  for (const std::string& note : merged.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  if (merged.n_duplicates > 0)
    std::fprintf(stderr, "note: %zu identical duplicate rows dropped\n", merged.n_duplicates);
  if (!o.out_path.empty()) eval::write_results(o.out_path, merged.rows);
  print_summary(eval::summarize(merged.rows), o.json);
}

void add_eval_score(CLI::App& eval_group) {
  auto o = std::make_shared<ScoreOptions>();
  CLI::App* cmd = eval_group.add_subcommand(
      "score",
      "score predictions made elsewhere (jsonl with prediction|pred and answers|gold) and summarise");
  cmd->add_option("--metric", o->metric, "math, qa_f1, rouge_l, classification, retrieval or count")
      ->required();
  cmd->add_option("file", o->path, "predictions, one JSON object per line")->required();
  cmd->add_flag("--json", o->json, "print the summary as JSON");
  cmd->callback([o] { run_score(*o); });
}

void add_eval_merge(CLI::App& eval_group) {
  auto o = std::make_shared<MergeOptions>();
  CLI::App* cmd = eval_group.add_subcommand(
      "merge",
      "combine results files (e.g. shards), check duplicates agree, print the summary and comparison");
  cmd->add_option("files", o->paths, "results files written by choreo eval")->required();
  cmd->add_option("-o,--out", o->out_path, "write the merged rows to this file");
  cmd->add_flag("--json", o->json, "print the summary as JSON");
  cmd->callback([o] { run_merge(*o); });
}

}  // namespace

void register_eval(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "eval", "run a workflow over a dataset (eval WORKFLOW.yaml --data FILE), score predictions, merge shards");
  cmd->require_subcommand(0, 1);
  add_eval_score(*cmd);
  add_eval_merge(*cmd);
  add_eval_run(*cmd);
}

}  // namespace choreo::cli
