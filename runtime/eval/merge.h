#pragma once
// Combining the results files of several shards (or of a run and its resumption) into one set of rows.

#include <string>
#include <vector>

#include "runtime/eval/results.h"

namespace choreo::eval {

/// The union of the files' rows, first occurrence first.
struct Merged {
  std::vector<ResultRow> rows;
  size_t n_duplicates = 0;         // identical (id, mode) repeats dropped
  std::vector<std::string> notes;  // e.g. a truncated last line that was ignored
};

/// Reads and merges `paths`. A (row id, mode) seen twice with the same outcome keeps the first; with a
/// different prediction, answer or score it is an InputError naming both places.
Merged merge_results(const std::vector<std::string>& paths);

/// Writes `rows` to `path` (replacing it), one line each.
void write_results(const std::string& path, const std::vector<ResultRow>& rows);

}  // namespace choreo::eval
