#include "runtime/eval/results.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/common/error.h"
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

ResultsFile read_results(const std::string& path) {
  ResultsFile out;
  if (!std::filesystem::exists(path)) return out;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open results file '{}'", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const bool ends_clean = text.empty() || text.back() == '\n';
  size_t start = 0;
  for (int number = 1; start < text.size(); ++number) {
    size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    if (last) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    exec::JsonLine parsed = exec::parse_json_line(number, line);
    if (!parsed.json_error.empty()) {
      if (last && !ends_clean) {  // a writer killed mid-line: that row was never finished
        out.truncated_tail = true;
        break;
      }
      throw InputError(fmt::format("line is not JSON: {}", parsed.json_error),
                       "only the last line of a results file may be cut off",
                       SourceLocation{path, number, parsed.json_error_column()}, line);
    }
    out.rows.push_back(result_from_json(parsed.value, path, number));
    out.lines.push_back(number);
  }
  return out;
}

std::set<std::pair<std::string, std::string>> done_keys(const std::vector<ResultRow>& rows) {
  std::set<std::pair<std::string, std::string>> out;
  for (const ResultRow& row : rows) out.emplace(row.id, row.mode);
  return out;
}

ResultWriter::ResultWriter(const std::string& path, bool sync_each_row)
    : path_(path), sync_each_row_(sync_each_row) {
  // Cut a partial last line (no newline after it) so appended rows do not glue onto it.
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (!error && size > 0) {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() != '\n') {
      const size_t last_newline = text.rfind('\n');
      std::filesystem::resize_file(path, last_newline == std::string::npos ? 0 : last_newline + 1, error);
      if (error) throw RuntimeFailure(fmt::format("cannot repair '{}': {}", path, error.message()));
    }
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw RuntimeFailure(fmt::format("cannot open '{}' for writing: {}", path, std::strerror(errno)));
}

ResultWriter::~ResultWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ResultWriter::append(const ResultRow& row) {
  // Invalid UTF-8 (a generation cut inside a character) is replaced rather than refused.
  const std::string line = to_json(row).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw RuntimeFailure(fmt::format("cannot write to '{}': {}", path_, std::strerror(errno)));
    written += static_cast<size_t>(n);
  }
  if (sync_each_row_ && ::fsync(fd_) != 0)
    throw RuntimeFailure(fmt::format("cannot sync '{}': {}", path_, std::strerror(errno)));
}

}  // namespace choreo::eval
