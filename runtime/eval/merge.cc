#include "runtime/eval/merge.h"

#include <filesystem>
#include <map>

#include "common/atomic_file.h"
#include "common/error.h"

namespace choreo::eval {

Merged merge_results(const std::vector<std::string>& paths) {
  Merged out;
  struct Seen {
    size_t index;
    std::string path;
    int line;
  };
  std::map<std::pair<std::string, std::string>, Seen> seen;
  for (const std::string& path : paths) {
    if (!std::filesystem::exists(path))
      throw InputError(fmt::format("results file '{}' does not exist", path));
    ResultsFile file = read_results(path);
    if (file.truncated_tail)
      out.notes.push_back(fmt::format("{}: the last line is cut off (a killed run) and was ignored", path));
    for (size_t i = 0; i < file.rows.size(); ++i) {
      ResultRow& row = file.rows[i];
      auto key = std::make_pair(row.id, row.mode);
      auto it = seen.find(key);
      if (it == seen.end()) {
        seen.emplace(key, Seen{out.rows.size(), path, file.lines[i]});
        out.rows.push_back(std::move(row));
        continue;
      }
      if (!out.rows[it->second.index].same_outcome(row))
        throw InputError(
            fmt::format("row '{}' in mode '{}' has a different result than at {}:{}", row.id, row.mode,
                        it->second.path, it->second.line),
            "the same row was run twice with different outcomes: were the shards run with the same workflow, "
            "model and seeds?",
            SourceLocation{path, file.lines[i], 0});
      ++out.n_duplicates;
    }
  }
  return out;
}

void write_results(const std::string& path, const std::vector<ResultRow>& rows) {
  std::string text;
  for (const ResultRow& row : rows) text += result_line(row);
  write_file_atomically(path, text);
}

}  // namespace choreo::eval
