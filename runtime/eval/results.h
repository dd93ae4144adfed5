#pragma once
// The results file of an evaluation: one JSON line per (row, mode). The writer appends and flushes each
// line as it is finished, so a crash or kill loses nothing already written; the reader ignores (and
// reports) a truncated last line, so `--resume` can skip what is done and carry on.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace choreo::eval {

/// One evaluated (row, mode): the prediction, its score and what it cost.
struct ResultRow {
  std::string id, mode;
  std::string prediction, extracted;
  std::vector<std::string> gold;
  double score = 0;
  std::string metric;              // metric_name() of the score
  std::string subject, level;      // MATH breakdowns; empty elsewhere
  double ttft_ms = 0, e2e_ms = 0;  // time to the first generated token; whole workflow instance
  int64_t tokens_generated = 0, tokens_computed = 0, tokens_reused = 0;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // anything else a run wants to keep

  /// The fields that must agree when the same (id, mode) appears twice (not timings, token counts or extra,
  /// except the decodes' fingerprint `extra.decodes_xxh3` when both rows have one).
  bool same_outcome(const ResultRow& other) const;
};

nlohmann::ordered_json to_json(const ResultRow& row);
/// One row as the line a results file holds (JSON and a newline).
std::string result_line(const ResultRow& row);
/// InputError (naming `path`:`line`) when a required field is missing or mistyped.
ResultRow result_from_json(const nlohmann::json& value, const std::string& path, int line);

/// A kind of JSON Lines file that choreo appends to, as its writer writes it: `what` names it in messages,
/// and each of its lines starts with one of `line_starts` (the writer's first key). That start tells a line a
/// killed writer cut off from text that is not the writer's, which is never cut (docs/limits.md).
struct AppendedLines {
  std::string_view what;
  std::vector<std::string_view> line_starts;
  /// Whether `line` begins as this kind's lines begin.
  bool starts_like_line(std::string_view line) const;
};
/// eval's results files: each line a result row, `{"id":...`.
inline const AppendedLines kResultLines{"results file", {R"({"id":)"}};

/// A JSON Lines file that a killed writer may have left with a partial last line (eval's results, the reuse
/// profiler's log): its values in order and the line each came from.
struct JsonLinesFile {
  std::vector<nlohmann::json> values;
  std::vector<int> lines;
  bool truncated_tail = false;  // the last line was cut off (a killed writer) and was ignored
};
/// Reads `path` (a missing file reads as empty; blank lines are skipped) through the input limits. A last
/// line without a newline that is not JSON is taken for a killed writer's and ignored when it starts as
/// `kind`'s lines do; any other malformed line is an InputError at file:line:col.
JsonLinesFile read_json_lines(const std::string& path, const AppendedLines& kind);

/// Appends lines to a file of one kind, one write per line (and fsync when asked).
class LineAppender {
 public:
  /// Opens `path` for appending, creating it (`flag` names the option that gave it, for errors). A last line
  /// without its newline is first ended with one when it is a whole JSON line, cut off when it is a killed
  /// writer's partial line (it starts as `kind`'s lines do), and otherwise refused with an InputError, the
  /// file unchanged: it is not `kind`'s. RuntimeFailure when the file cannot be opened or repaired.
  LineAppender(const std::string& path, std::string_view flag, const AppendedLines& kind,
               bool sync_each_line = false);
  ~LineAppender();
  LineAppender(const LineAppender&) = delete;
  LineAppender& operator=(const LineAppender&) = delete;

  /// Writes `line` (which ends with its newline) in one write. RuntimeFailure on an I/O error.
  void append(std::string_view line);

 private:
  void finish_last_line(std::string_view flag, const AppendedLines& kind);

  std::string path_;
  int fd_ = -1;
  bool sync_each_line_;
};

/// A results file as read.
struct ResultsFile {
  std::vector<ResultRow> rows;
  std::vector<int> lines;       // the line each row came from
  bool truncated_tail = false;  // the last line was cut off (a killed writer) and was ignored
};
/// Reads `path` (a missing file reads as empty) as read_json_lines does with kResultLines, each line then a
/// result row. Anything else is an InputError at file:line:col.
ResultsFile read_results(const std::string& path);

/// (row id, mode) pairs already present: what `--resume` skips.
std::set<std::pair<std::string, std::string>> done_keys(const std::vector<ResultRow>& rows);

/// Appends result lines to a file, one write per row (and fsync when asked): a LineAppender for `--out`.
class ResultWriter {
 public:
  explicit ResultWriter(const std::string& path, bool sync_each_row = false)
      : out_(path, "--out", kResultLines, sync_each_row) {}
  /// Writes one row as one line. RuntimeFailure on an I/O error.
  void append(const ResultRow& row) { out_.append(result_line(row)); }

 private:
  LineAppender out_;
};

}  // namespace choreo::eval
