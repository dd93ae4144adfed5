#pragma once
// The metrics `choreo eval` knows, by name, and the per-sample score: the max over gold answers of one
// official per-answer score (LongBench's scorer; for MATH, equivalence with any gold answer).

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace choreo::eval {

/// A scoring rule: MATH equivalence or one of LongBench's metrics.
enum class Metric { math, qa_f1, rouge_l, classification, retrieval, count };

/// "math", "qa_f1", ...
std::string_view metric_name(Metric metric);
/// Every metric name, in the order of the enum.
std::span<const std::string_view> metric_names();
/// The metric called `name`; InputError (with a did-you-mean hint) otherwise.
Metric parse_metric(std::string_view name);
/// True when a sample's score is 0 or 1 (MATH accuracy), so McNemar's test applies.
bool is_binary(Metric metric);
/// LongBench's dataset2metric for English and code-free datasets ("musique" -> qa_f1, "multi_news" ->
/// rouge_l, "trec" -> classification, ...); nullopt for datasets whose metric choreo lacks.
std::optional<Metric> metric_for_dataset(std::string_view dataset);

/// What a sample is scored against, beyond the prediction.
struct ScoreContext {
  std::vector<std::string> gold;         // gold answers; the score is the max over them
  std::vector<std::string> all_classes;  // classification's label set
  std::string dataset;                   // LongBench's dataset name, for its first-line rule
};

/// One sample's score in [0, 1] and the answer extracted from the prediction (MATH: the last \boxed{}
/// content, "" when there is none; other metrics: the prediction as scored).
struct SampleScore {
  double score = 0;
  std::string extracted;
};

/// Scores one prediction. MATH: a gold answer holding a \boxed{} is reduced to its content first (so a
/// full solution works as gold). LongBench: for trec, triviaqa, samsum and lsht the prediction is cut to
/// its first line, as LongBench's eval.py does. Throws InputError for unusable gold (no answers;
/// retrieval gold without "Paragraph N").
SampleScore score_sample(Metric metric, std::string_view prediction, const ScoreContext& context);

}  // namespace choreo::eval
