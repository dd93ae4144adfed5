#include "runtime/eval/dataset.h"

#include <array>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/error.h"
#include "common/input_file.h"
#include "common/suggest.h"
#include "runtime/eval/math_answer.h"
#include "runtime/exec/json_line.h"

namespace choreo::eval {

using json = nlohmann::json;

namespace {

constexpr std::array<std::string_view, 4> kFormatNames = {"math", "longbench", "musique", "jsonl"};

bool is_blank(std::string_view text) { return text.find_first_not_of(" \t\r\n") == std::string_view::npos; }

/// Where a row is, for errors about it: file:line, quoting the line (an excerpt of it when it is long).
struct RowSite {
  const std::string& path;
  int line;
  std::string_view text;

  [[noreturn]] void fail(const std::string& message, const std::string& hint = {}) const {
    throw InputError(message, hint, SourceLocation{path, line, 0}, text);
  }
  /// A required string field.
  std::string string(const json& object, std::string_view key) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null())
      fail(fmt::format("the row has no \"{}\"", key), "each row of this format needs it (docs/eval.md)");
    if (!it->is_string()) fail(fmt::format("\"{}\" is {}, not a string", key, exec::type_name(*it)));
    return it->get<std::string>();
  }
  /// A required string, or list of strings, field.
  std::vector<std::string> strings(const json& object, std::string_view key) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) fail(fmt::format("the row has no \"{}\"", key));
    if (it->is_string()) return {it->get<std::string>()};
    if (!it->is_array()) fail(fmt::format("\"{}\" is {}, not a list of strings", key, exec::type_name(*it)));
    std::vector<std::string> out;
    for (const json& item : *it) {
      if (item.is_string())
        out.push_back(item.get<std::string>());
      else if (item.is_number())
        out.push_back(item.dump());
      else
        fail(fmt::format("\"{}\" holds {}, not a string", key, exec::type_name(item)));
    }
    return out;
  }
};

/// Every top-level string, number or boolean of a row, as text: what a workflow can take as input.
std::map<std::string, std::string> scalar_fields(const json& object) {
  std::map<std::string, std::string> out;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it->is_string())
      out[it.key()] = it->get<std::string>();
    else if (it->is_number() || it->is_boolean())
      out[it.key()] = it->dump();
  }
  return out;
}

/// A row id from a string or integer field.
std::optional<std::string> id_field(const json& object, std::string_view key) {
  auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return it->dump();
  return std::nullopt;
}

Row math_row(const json& object, const RowSite& site, size_t index) {
  Row row;
  row.fields = scalar_fields(object);
  site.string(object, "problem");
  auto answer = object.find("answer");
  if (answer != object.end() && (answer->is_string() || answer->is_number())) {
    row.gold = {answer->is_string() ? answer->get<std::string>() : answer->dump()};
  } else {
    const std::string solution = site.string(object, "solution");
    std::optional<std::string> boxed = extract_boxed_answer(solution);
    if (!boxed)
      site.fail("the row's solution has no \\boxed{...} answer",
                "MATH rows need \"answer\" or a boxed solution");
    row.gold = {*boxed};
  }
  row.id = id_field(object, "unique_id").value_or(id_field(object, "idx").value_or(std::to_string(index)));
  for (const char* key : {"subject", "type"}) {
    auto it = object.find(key);
    if (it != object.end() && it->is_string()) {
      row.subject = it->get<std::string>();
      break;
    }
  }
  auto level = object.find("level");
  if (level != object.end()) {
    if (level->is_number_integer()) row.level = level->dump();
    if (level->is_string()) {
      std::string text = level->get<std::string>();
      row.level = text.starts_with("Level ") ? text.substr(6) : text;
    }
  }
  row.dataset = "math";
  return row;
}

Row longbench_row(const json& object, const RowSite& site) {
  Row row;
  row.fields = scalar_fields(object);
  site.string(object, "input");
  site.string(object, "context");
  row.gold = site.strings(object, "answers");
  row.id = site.string(object, "_id");
  auto classes = object.find("all_classes");
  if (classes != object.end() && !classes->is_null()) row.all_classes = site.strings(object, "all_classes");
  auto dataset = object.find("dataset");
  if (dataset != object.end() && dataset->is_string()) row.dataset = dataset->get<std::string>();
  return row;
}

Row plain_row(const json& object, const RowSite& site, size_t index) {
  Row row;
  row.fields = scalar_fields(object);
  row.id = id_field(object, "id").value_or(id_field(object, "_id").value_or(std::to_string(index)));
  const char* gold_key = nullptr;
  for (const char* key : {"answers", "answer", "gold"})
    if (object.contains(key) && !object[key].is_null()) {
      gold_key = key;
      break;
    }
  if (!gold_key) site.fail("the row has no gold answer", "give \"answers\" (a list), \"answer\" or \"gold\"");
  row.gold = site.strings(object, gold_key);
  if (object.contains("all_classes") && !object["all_classes"].is_null())
    row.all_classes = site.strings(object, "all_classes");
  if (auto it = object.find("dataset"); it != object.end() && it->is_string())
    row.dataset = it->get<std::string>();
  return row;
}

/// Reads a jsonl file a line at a time, one row per non-blank line, with `make(object, site, index)`.
template <typename MakeRow>
std::vector<Row> read_jsonl(const std::string& path, MakeRow make) {
  std::vector<Row> rows;
  LineReader reader(path, "data file");
  std::string line;
  while (reader.next(line)) {
    const int number = reader.line_number();
    if (is_blank(line)) continue;
    exec::JsonLine parsed = exec::parse_json_line(number, line);
    const RowSite site{path, number, line};
    if (!parsed.json_error.empty())
      throw InputError(fmt::format("line is not JSON: {}", parsed.json_error),
                       "each line must be one JSON object",
                       SourceLocation{path, number, parsed.json_error_column()}, line);
    if (!parsed.value.is_object())
      site.fail(fmt::format("the line is {}, not a JSON object", exec::type_name(parsed.value)));
    Row row = make(parsed.value, site, rows.size());
    row.line = number;
    rows.push_back(std::move(row));
  }
  return rows;
}

int line_of_byte(const std::string& text, size_t byte) {
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + std::min(byte, text.size()), '\n'));
}

int column_of_byte(const std::string& text, size_t byte) {
  byte = std::min(byte, text.size());
  const size_t newline = byte == 0 ? std::string::npos : text.rfind('\n', byte - 1);
  return static_cast<int>(byte - (newline == std::string::npos ? 0 : newline + 1)) + 1;
}

/// The CacheBlend MuSiQue sample: one JSON list of {ctxs: [{title, text}], question, answers}.
std::vector<Row> read_musique(const std::string& path, const std::string& text) {
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error& e) {
    const size_t byte = e.byte > 0 ? e.byte - 1 : 0;
    throw InputError("the file is not JSON", "a MuSiQue file is one JSON list of rows",
                     SourceLocation{path, line_of_byte(text, byte), column_of_byte(text, byte)});
  } catch (const json::exception& e) {  // well-formed but unreadable, e.g. a number beyond double range
    throw InputError(fmt::format("the file cannot be read: {}", e.what()), "a MuSiQue file is one JSON list of rows",
                     SourceLocation{path, 0, 0});
  }
  if (!value.is_array())
    throw InputError(fmt::format("the file holds {}, not a list of rows", exec::type_name(value)), {},
                     SourceLocation{path, 1, 0});
  const std::vector<exec::ByteRange> ranges = exec::element_ranges(text);
  std::vector<Row> rows;
  for (size_t i = 0; i < value.size(); ++i) {
    const int line = i < ranges.size() ? line_of_byte(text, ranges[i].begin) : 0;
    const RowSite site{path, line, {}};
    const json& object = value[i];
    if (!object.is_object())
      site.fail(fmt::format("row {} is {}, not an object", i, exec::type_name(object)));
    Row row;
    row.line = line;
    row.id = std::to_string(i);
    row.dataset = "musique";
    row.fields["question"] = site.string(object, "question");
    row.gold = site.strings(object, "answers");
    auto ctxs = object.find("ctxs");
    if (ctxs == object.end() || !ctxs->is_array()) site.fail("the row has no \"ctxs\" list of passages");
    std::string context;
    for (size_t k = 0; k < ctxs->size(); ++k) {
      const json& passage = (*ctxs)[k];
      if (!passage.is_object()) site.fail(fmt::format("passage {} is not an object", k));
      const std::string title = passage.contains("title") ? site.string(passage, "title") : std::string();
      const std::string body = site.string(passage, "text");
      row.fields[fmt::format("title_{}", k)] = title;
      row.fields[fmt::format("passage_{}", k)] = body;
      if (!context.empty()) context += "\n\n";
      context += title.empty() ? body : title + "\n" + body;
    }
    row.fields["context"] = context;
    row.fields["n_passages"] = std::to_string(ctxs->size());
    rows.push_back(std::move(row));
  }
  return rows;
}

/// The format of a data file, from its first non-blank line (the rest is not read): a JSON list is MuSiQue,
/// an object with MATH's or LongBench's fields is that format, anything else plain jsonl.
DataFormat detect_from_first_line(const std::string& path) {
  LineReader reader(path, "data file");
  std::string line;
  while (reader.next(line)) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    if (line[first] == '[') return DataFormat::musique;
    const exec::JsonLine parsed = exec::parse_json_line(reader.line_number(), line);
    const json& object = parsed.value;
    if (!parsed.json_error.empty() || !object.is_object()) return DataFormat::jsonl;
    if (object.contains("problem") && (object.contains("answer") || object.contains("solution")))
      return DataFormat::math;
    if (object.contains("input") && object.contains("context") && object.contains("answers"))
      return DataFormat::longbench;
    return DataFormat::jsonl;
  }
  return DataFormat::jsonl;
}

}  // namespace

std::string_view format_name(DataFormat format) { return kFormatNames[static_cast<size_t>(format)]; }

DataFormat parse_format(std::string_view name) {
  return static_cast<DataFormat>(index_of_name(name, kFormatNames, "data format", "formats"));
}

DataFormat detect_format(const std::string& path) { return detect_from_first_line(path); }

Dataset load_dataset(const std::string& path, std::optional<DataFormat> format) {
  Dataset out;
  out.path = path;
  out.format = format ? *format : detect_from_first_line(path);
  switch (out.format) {
    case DataFormat::math:
      out.rows = read_jsonl(path, math_row);
      out.metric = Metric::math;
      break;
    case DataFormat::longbench:
      out.rows =
          read_jsonl(path, [](const json& o, const RowSite& s, size_t) { return longbench_row(o, s); });
      break;
    case DataFormat::musique:
      out.rows = read_musique(path, read_input_file(path, "data file", input_policy().file_bytes));
      out.metric = Metric::qa_f1;
      break;
    case DataFormat::jsonl:
      out.rows = read_jsonl(path, plain_row);
      break;
  }
  if (out.rows.empty())
    throw InputError(fmt::format("the data file '{}' has no rows", path), "an empty file cannot be evaluated",
                     SourceLocation{path, 0, 0});
  if (!out.metric && !out.rows.front().dataset.empty())
    out.metric = metric_for_dataset(out.rows.front().dataset);
  std::unordered_map<std::string, int> seen;
  for (const Row& row : out.rows) {
    auto [it, fresh] = seen.emplace(row.id, row.line);
    if (!fresh)
      throw InputError(fmt::format("row id '{}' is used twice (first at line {})", row.id, it->second),
                       "row ids must be unique so results can be resumed and merged",
                       SourceLocation{path, row.line, 0});
  }
  return out;
}

}  // namespace choreo::eval
