#pragma once
// The cross-model reuse profiler (`choreo profile reuse`, docs/profile.md "Reuse plans"; DESIGN.md §6): a
// sender model encodes each dataset item's passages once; a receiver model answers the item's question
// reading them through one cross-model plan after another. Each plan is scored against `recompute` (the
// receiver encoding the passages itself, exact): token-F1 of the greedy answers, the mean KL divergence of the
// next-token distributions over recompute's answer (teacher-forced), and the dataset's own metric.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/divergence.h"
#include "runtime/eval/metric.h"
#include "runtime/engine/open_engine.h"

namespace choreo::eval {

/// One item a sender encodes and a receiver answers.
struct ReuseItem {
  std::string id;
  int line = 0;
  std::vector<model::Token> context;  // the sender's message: a user turn holding the passages
  std::vector<model::Token> header;   // the receiver's call: the question as a user turn, then its reply's header
  ScoreContext gold;
};

/// An item per dataset row, from its `context` and its question (`question`, or LongBench's `input`), as the
/// model's chat format writes user turns; the passages are cut to their first `max_context_tokens` tokens
/// (0: whole). InputError naming the row when one lacks either field.
std::vector<ReuseItem> reuse_items(const Dataset& data, const model::Model& model, int max_context_tokens);

/// What one plan gave on one item.
struct PlanRun {
  std::string text;        // the greedy answer
  double token_f1 = 0;     // against recompute's greedy answer (1 when identical)
  double kl = 0;           // mean over recompute's answer tokens of KL(recompute || plan), nats
  double metric = 0;       // the dataset's metric against the gold answers (0 without one)
  double ttft_ms = 0;      // the receiver's time to first token, making its encoding of the passages included
  int n_e_recomputed = 0;  // passage tokens whose E cache the sender had to recompute (0 when saved)
};

/// Runs plans on items: per item a fresh engine (opened with `engine`'s options, in choreo mode, over
/// `models`, whose weights must outlive the runner), where `sender` encodes the passages (saving its hidden
/// states at `e_cache_layers`), then `receiver` answers through each plan in turn.
class ReuseRunner {
 public:
  ReuseRunner(runtime::ModelSet models, int sender, int receiver, runtime::EngineOptions engine,
              std::optional<Metric> metric, int max_tokens);
  /// Starts `item`: encodes its passages with the sender and answers with `recompute`, the reference the
  /// plans are scored against.
  const PlanRun& start(const ReuseItem& item);
  /// Answers the current item through `plan`.
  PlanRun run(const runtime::CrossModelPlan& plan);

 private:
  // The receiver's greedy answer to the current item, over its passages.
  runtime::DecodeRequest answer_request() const;

  runtime::ModelSet models_;
  int sender_, receiver_;
  runtime::EngineOptions options_;
  std::optional<Metric> metric_;
  int max_tokens_;
  std::unique_ptr<runtime::OpenedEngine> opened_;
  runtime::Engine* engine_ = nullptr;
  const ReuseItem* item_ = nullptr;
  kv::MessageId context_ = kv::kNoMessage;
  runtime::DecodeResult reference_;
  PlanRun reference_run_;
};

/// The single-range plans of a sweep: [s, e) for s on multiples of `step` below n_layers and e on multiples of
/// `step` above s (and n_layers), with e - s <= max_span (0: any), [0, n_layers) excluded (it is recompute).
std::vector<runtime::CrossModelPlan> sweep_plans(int n_layers, int step, int max_span);

/// The `k` layers whose single-layer plans lost least (ties: the lower layer), as a plan of ascending ranges
/// (adjacent layers joined): the "critical layers" DroidSpeak's Fig. 11 compares one transition with.
/// `single_loss[l]` is the loss of [l, l + 1), NaN when not measured.
runtime::CrossModelPlan critical_layers_plan(const std::vector<double>& single_loss, int k);

}  // namespace choreo::eval
