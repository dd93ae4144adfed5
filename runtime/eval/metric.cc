#include "runtime/eval/metric.h"

#include <algorithm>
#include <array>

#include "common/error.h"
#include "common/suggest.h"
#include "runtime/eval/longbench_metrics.h"
#include "runtime/eval/math_answer.h"
#include "runtime/eval/python_text.h"
#include "runtime/eval/rouge.h"

namespace choreo::eval {

namespace {

constexpr std::array<std::string_view, 6> kNames = {"math",           "qa_f1",     "rouge_l",
                                                    "classification", "retrieval", "count"};

/// Python's prediction.lstrip('\n').split('\n')[0].
std::string_view first_line(std::string_view text) {
  const size_t start = text.find_first_not_of('\n');
  if (start == std::string_view::npos) return {};
  text.remove_prefix(start);
  return text.substr(0, text.find('\n'));
}

double score_one(Metric metric, std::string_view prediction, const std::string& gold,
                 const ScoreContext& context) {
  switch (metric) {
    case Metric::qa_f1:
      return qa_f1_score(prediction, gold);
    case Metric::rouge_l:
      return rouge_l_score(prediction, gold);
    case Metric::classification:
      return classification_score(prediction, gold, context.all_classes);
    case Metric::retrieval:
      return retrieval_score(prediction, gold);
    case Metric::count:
      return count_score(prediction, gold);
    case Metric::math:
      break;
  }
  return 0.0;
}

}  // namespace

std::string_view metric_name(Metric metric) { return kNames[static_cast<size_t>(metric)]; }

std::span<const std::string_view> metric_names() { return kNames; }

Metric parse_metric(std::string_view name) {
  return static_cast<Metric>(index_of_name(name, kNames, "metric", "metrics"));
}

bool is_binary(Metric metric) { return metric == Metric::math; }

std::optional<Metric> metric_for_dataset(std::string_view dataset) {
  static constexpr std::array<std::pair<std::string_view, Metric>, 15> kTable = {{
      {"hotpotqa", Metric::qa_f1},
      {"2wikimqa", Metric::qa_f1},
      {"musique", Metric::qa_f1},
      {"narrativeqa", Metric::qa_f1},
      {"qasper", Metric::qa_f1},
      {"multifieldqa_en", Metric::qa_f1},
      {"gov_report", Metric::rouge_l},
      {"qmsum", Metric::rouge_l},
      {"multi_news", Metric::rouge_l},
      {"samsum", Metric::rouge_l},
      {"trec", Metric::classification},
      {"triviaqa", Metric::qa_f1},
      {"passage_retrieval_en", Metric::retrieval},
      {"passage_count", Metric::count},
      {"math", Metric::math},
  }};
  // LongBench-E files carry the same names with an "_e" suffix.
  std::string_view base = dataset;
  if (base.ends_with("_e")) base.remove_suffix(2);
  for (const auto& [name, metric] : kTable)
    if (name == base) return metric;
  return std::nullopt;
}

SampleScore score_sample(Metric metric, std::string_view prediction, const ScoreContext& context) {
  if (context.gold.empty())
    throw InputError("the sample has no gold answer", "give at least one answer in \"answers\" or \"gold\"");
  SampleScore out;
  if (metric == Metric::math) {
    std::optional<std::string> answer = extract_boxed_answer(prediction);
    out.extracted = answer.value_or("");
    for (const std::string& gold : context.gold) {
      std::optional<std::string> wanted =
          gold.find("\\boxed") != std::string::npos || gold.find("\\fbox") != std::string::npos
              ? extract_boxed_answer(gold)
              : std::optional<std::string>(gold);
      if (wanted && is_equiv(answer, wanted)) out.score = 1.0;
    }
    return out;
  }
  static constexpr std::array<std::string_view, 4> kFirstLine = {"trec", "triviaqa", "samsum", "lsht"};
  std::string_view dataset = context.dataset;
  if (dataset.ends_with("_e")) dataset.remove_suffix(2);
  if (std::find(kFirstLine.begin(), kFirstLine.end(), dataset) != kFirstLine.end())
    prediction = first_line(prediction);
  out.extracted = std::string(prediction);
  for (const std::string& gold : context.gold)
    out.score = std::max(out.score, score_one(metric, prediction, gold, context));
  return out;
}

}  // namespace choreo::eval
