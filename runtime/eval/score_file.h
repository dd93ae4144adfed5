#pragma once
// Scoring predictions made elsewhere (`choreo eval score`), so other systems' outputs are compared under
// the same rules: a jsonl file with `prediction` (or LongBench's `pred`) and `answers` (or `gold` /
// `answer`) per line, optionally `all_classes`, `dataset`, `id` / `_id`, `mode`, `subject` / `type` and
// `level`.

#include <string>
#include <vector>

#include "runtime/eval/metric.h"
#include "runtime/eval/results.h"

namespace choreo::eval {

/// One ResultRow per non-blank line, scored with `metric`. Rows without an id are numbered by line; rows
/// without a mode get "-". InputError (file:line) for malformed lines and missing fields.
std::vector<ResultRow> score_file(const std::string& path, Metric metric);

}  // namespace choreo::eval
