#include "runtime/eval/results.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "runtime/exec/json_line.h"

namespace choreo::eval {

using json = nlohmann::json;

bool ResultRow::same_outcome(const ResultRow& other) const {
  const char* kFingerprint = "decodes_xxh3";
  if (extra.contains(kFingerprint) && other.extra.contains(kFingerprint) &&
      extra[kFingerprint] != other.extra[kFingerprint])
    return false;
  return id == other.id && mode == other.mode && prediction == other.prediction &&
         extracted == other.extracted && gold == other.gold && score == other.score && metric == other.metric;
}

nlohmann::ordered_json to_json(const ResultRow& row) {
  nlohmann::ordered_json j;
  j["id"] = row.id;
  j["mode"] = row.mode;
  j["prediction"] = row.prediction;
  j["extracted"] = row.extracted;
  j["gold"] = row.gold;
  j["score"] = row.score;
  j["metric"] = row.metric;
  if (!row.subject.empty()) j["subject"] = row.subject;
  if (!row.level.empty()) j["level"] = row.level;
  j["ttft_ms"] = row.ttft_ms;
  j["e2e_ms"] = row.e2e_ms;
  j["tokens_generated"] = row.tokens_generated;
  j["tokens_computed"] = row.tokens_computed;
  j["tokens_reused"] = row.tokens_reused;
  if (!row.extra.empty()) j["extra"] = row.extra;
  return j;
}

namespace {

struct Reader {
  const json& value;
  const std::string& path;
  int line;

  [[noreturn]] void fail(const std::string& message) const {
    throw InputError(message, "result lines are written by `choreo eval` (docs/eval.md lists the fields)",
                     SourceLocation{path, line, 0});
  }
  const json* find(const char* key) const {
    auto it = value.find(key);
    return it == value.end() || it->is_null() ? nullptr : &*it;
  }
  std::string string(const char* key, bool required) const {
    const json* v = find(key);
    if (!v) {
      if (required) fail(fmt::format("the result has no \"{}\"", key));
      return {};
    }
    if (v->is_number()) return v->dump();  // an integer row id written by another tool
    if (!v->is_string()) fail(fmt::format("\"{}\" is {}, not a string", key, exec::type_name(*v)));
    return v->get<std::string>();
  }
  double number(const char* key, bool required) const {
    const json* v = find(key);
    if (!v) {
      if (required) fail(fmt::format("the result has no \"{}\"", key));
      return 0;
    }
    if (!v->is_number()) fail(fmt::format("\"{}\" is {}, not a number", key, exec::type_name(*v)));
    return v->get<double>();
  }
};

}  // namespace

ResultRow result_from_json(const json& value, const std::string& path, int line) {
  if (!value.is_object())
    throw InputError(fmt::format("the line is {}, not a JSON object", exec::type_name(value)), {},
                     SourceLocation{path, line, 0});
  const Reader r{value, path, line};
  ResultRow row;
  row.id = r.string("id", true);
  row.mode = r.string("mode", true);
  row.prediction = r.string("prediction", false);
  row.extracted = r.string("extracted", false);
  if (const json* gold = r.find("gold")) {
    if (gold->is_string()) {
      row.gold = {gold->get<std::string>()};
    } else if (gold->is_array()) {
      for (const json& g : *gold) {
        if (!g.is_string()) r.fail("\"gold\" holds a non-string");
        row.gold.push_back(g.get<std::string>());
      }
    } else {
      r.fail(fmt::format("\"gold\" is {}, not a list of strings", exec::type_name(*gold)));
    }
  }
  row.score = r.number("score", true);
  // Every metric scores in [0, 1]: anything else is no score choreo wrote (1e308 summed to inf).
  if (!(row.score >= 0 && row.score <= 1)) r.fail(fmt::format("\"score\" is {}, outside 0..1", row.score));
  row.metric = r.string("metric", false);
  row.subject = r.string("subject", false);
  row.level = r.string("level", false);
  row.ttft_ms = r.number("ttft_ms", false);
  row.e2e_ms = r.number("e2e_ms", false);
  row.tokens_generated = static_cast<int64_t>(r.number("tokens_generated", false));
  row.tokens_computed = static_cast<int64_t>(r.number("tokens_computed", false));
  row.tokens_reused = static_cast<int64_t>(r.number("tokens_reused", false));
  if (const json* extra = r.find("extra")) row.extra = nlohmann::ordered_json::parse(extra->dump());
  return row;
}

bool AppendedLines::starts_like_line(std::string_view line) const {
  return std::any_of(line_starts.begin(), line_starts.end(),
                     [&](std::string_view start) { return line.starts_with(start); });
}

JsonLinesFile read_json_lines(const std::string& path, const AppendedLines& kind) {
  JsonLinesFile out;
  std::error_code exists_error;
  if (!std::filesystem::exists(path, exists_error)) return out;
  LineReader reader(path, kind.what);
  std::string line;
  while (reader.next(line)) {
    const int number = reader.line_number();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    exec::JsonLine parsed = exec::parse_json_line(number, line);
    if (!parsed.json_error.empty()) {
      // A writer killed mid-line: that line was never finished. A one-line note or token without a newline
      // is no such line, and neither is anything after lines that are not this kind's (they failed above).
      if (reader.last_line_unterminated() && kind.starts_like_line(line)) {
        out.truncated_tail = true;
        break;
      }
      throw InputError(fmt::format("line is not JSON: {}", parsed.json_error),
                       fmt::format("this is not a {} choreo wrote: only a last line that starts as its lines "
                                   "do ({}) may be cut off; give another file",
                                   kind.what, kind.line_starts.front()),
                       SourceLocation{path, number, parsed.json_error_column()}, line);
    }
    out.values.push_back(std::move(parsed.value));
    out.lines.push_back(number);
  }
  return out;
}

ResultsFile read_results(const std::string& path) {
  JsonLinesFile file = read_json_lines(path, kResultLines);
  ResultsFile out;
  out.truncated_tail = file.truncated_tail;
  for (size_t i = 0; i < file.values.size(); ++i) out.rows.push_back(result_from_json(file.values[i], path, file.lines[i]));
  out.lines = std::move(file.lines);
  return out;
}

std::set<std::pair<std::string, std::string>> done_keys(const std::vector<ResultRow>& rows) {
  std::set<std::pair<std::string, std::string>> out;
  for (const ResultRow& row : rows) out.emplace(row.id, row.mode);
  return out;
}

LineAppender::LineAppender(const std::string& path, std::string_view flag, const AppendedLines& kind,
                           bool sync_each_line)
    : path_(path), sync_each_line_(sync_each_line) {
  fd_ = open_for_append(path, flag);
  try {
    finish_last_line(flag, kind);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

void LineAppender::finish_last_line(std::string_view flag, const AppendedLines& kind) {
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return;
  // Only the end of the file is read: back from the end to the last newline.
  const off_t size = st.st_size;
  off_t keep = 0;  // bytes up to and including the last newline
  char chunk[4096];
  for (off_t end = size; end > 0 && keep == 0;) {
    const off_t begin = end > off_t(sizeof chunk) ? end - off_t(sizeof chunk) : 0;
    const ssize_t n = ::pread(fd_, chunk, size_t(end - begin), begin);
    if (n != end - begin)
      throw RuntimeFailure(fmt::format("cannot read '{}': {}", path_, std::strerror(errno)));
    for (ssize_t i = n - 1; i >= 0; --i)
      if (chunk[i] == '\n') {
        keep = begin + i + 1;
        break;
      }
    end = begin;
  }
  if (keep == size) return;
  const auto refuse = [&] {
    throw InputError(
        fmt::format("{} '{}' ends in a line without a newline that is not a {}'s", flag, path_, kind.what),
        fmt::format("{} appends to a {} only, and cuts off only a line a killed run left; give "
                    "another file",
                    flag, kind.what),
        SourceLocation{path_, 0, 0});
  };
  // The last line is bounded as every input line is (reading the file before appending checked it).
  if (uint64_t(size - keep) > input_policy().file_bytes) refuse();
  std::string tail(size_t(size - keep), '\0');
  if (::pread(fd_, tail.data(), tail.size(), keep) != ssize_t(tail.size()))
    throw RuntimeFailure(fmt::format("cannot read '{}': {}", path_, std::strerror(errno)));
  if (!kind.starts_like_line(tail)) refuse();
  if (exec::parse_json_line(0, std::move(tail)).json_error.empty()) {
    append("\n");  // a whole line that lacks only its newline: kept
    return;
  }
  if (::ftruncate(fd_, keep) != 0)
    throw RuntimeFailure(fmt::format("cannot repair '{}': {}", path_, std::strerror(errno)));
}

LineAppender::~LineAppender() {
  if (fd_ >= 0) ::close(fd_);
}

std::string result_line(const ResultRow& row) {
  // Invalid UTF-8 (a generation cut inside a character) is replaced rather than refused.
  return to_json(row).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void LineAppender::append(std::string_view line) {
  if (!write_all(fd_, line))
    throw RuntimeFailure(fmt::format("cannot write to '{}': {}", path_, std::strerror(errno)));
  if (sync_each_line_ && ::fsync(fd_) != 0)
    throw RuntimeFailure(fmt::format("cannot sync '{}': {}", path_, std::strerror(errno)));
}

}  // namespace choreo::eval
