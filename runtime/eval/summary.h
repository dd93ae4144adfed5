#pragma once
// The summary of a results set: per mode the mean score (x100) with its 95% bootstrap interval, timings and
// token counts, MATH accuracy by subject and level; for each mode against the baseline the paired
// difference with its interval, McNemar's exact p for 0/1 scores, and TTFT / end-to-end ratios.

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/eval/results.h"
#include "common/statistics.h"

namespace choreo::eval {

/// A count of right answers in a group (MATH subject or level).
struct GroupAccuracy {
  size_t n = 0;
  double sum = 0;  // sum of scores; accuracy = sum / n
};

/// One mode's results.
struct ModeSummary {
  std::string mode;
  stats::Estimate score;                                                        // over rows in id order, in [0, 1]
  double ttft_ms = 0, e2e_ms = 0;                                        // means
  int64_t tokens_generated = 0, tokens_computed = 0, tokens_reused = 0;  // totals
  std::map<std::string, GroupAccuracy> by_subject, by_level;
};

/// One mode against the baseline, over the row ids both have.
struct Comparison {
  std::string baseline, treatment;
  size_t n_pairs = 0;
  stats::Estimate difference;                          // treatment - baseline, in [−1, 1]
  std::optional<stats::McNemar> mcnemar;               // when every score of both modes is 0 or 1
  std::optional<double> ttft_ratio, e2e_ratio;  // baseline mean / treatment mean; absent when undefined
};

/// Everything `choreo eval merge` and `choreo eval score` print.
struct Summary {
  std::string metric;              // the rows' metric name when they agree, else "mixed"
  std::vector<ModeSummary> modes;  // the baseline first, then the others by name
  std::vector<Comparison> comparisons;
};

/// The baseline is `prefix` when present, else `naive`, else the first mode by name; every other mode is
/// compared with it over the row ids both have. Rows are taken in id order, so the result does not depend
/// on the order of `rows` (shards merged in any order summarise alike).
Summary summarize(const std::vector<ResultRow>& rows);

/// A table for people.
std::string format_summary(const Summary& summary);
/// The same for machines (scores x100, as printed).
nlohmann::ordered_json summary_to_json(const Summary& summary);

}  // namespace choreo::eval
