#include "runtime/eval/score_file.h"

#include <map>

#include "common/error.h"
#include "common/input_file.h"
#include "runtime/exec/json_line.h"

namespace choreo::eval {

using json = nlohmann::json;

namespace {

struct LineSite {
  const std::string& path;
  int line;

  [[noreturn]] void fail(const std::string& message, const std::string& hint = {}) const {
    throw InputError(message, hint, SourceLocation{path, line, 0});
  }
  const json* first_of(const json& object, std::initializer_list<const char*> keys) const {
    for (const char* key : keys) {
      auto it = object.find(key);
      if (it != object.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }
  std::string text(const json& value, const char* what) const {
    if (value.is_string()) return value.get<std::string>();
    if (value.is_number()) return value.dump();
    fail(fmt::format("{} is {}, not a string", what, exec::type_name(value)));
  }
  std::vector<std::string> texts(const json& value, const char* what) const {
    if (!value.is_array()) return {text(value, what)};
    std::vector<std::string> out;
    for (const json& item : value) out.push_back(text(item, what));
    return out;
  }
};

ResultRow score_line(const json& object, const LineSite& site, Metric metric) {
  if (!object.is_object())
    site.fail(fmt::format("the line is {}, not a JSON object", exec::type_name(object)));
  const json* prediction = site.first_of(object, {"prediction", "pred"});
  if (!prediction) site.fail("the line has no \"prediction\" (or \"pred\")");
  const json* gold = site.first_of(object, {"answers", "gold", "answer"});
  if (!gold) site.fail("the line has no gold answer", "give \"answers\" (a list), \"gold\" or \"answer\"");

  ResultRow row;
  row.prediction = site.text(*prediction, "the prediction");
  ScoreContext context;
  context.gold = site.texts(*gold, "a gold answer");
  if (const json* classes = site.first_of(object, {"all_classes"}))
    context.all_classes = site.texts(*classes, "a class");
  if (const json* dataset = site.first_of(object, {"dataset"}))
    context.dataset = site.text(*dataset, "dataset");
  try {
    SampleScore scored = score_sample(metric, row.prediction, context);
    row.score = scored.score;
    row.extracted = std::move(scored.extracted);
  } catch (const InputError& e) {
    site.fail(e.message(), e.hint());
  }
  row.gold = context.gold;
  row.metric = std::string(metric_name(metric));
  const json* id = site.first_of(object, {"id", "_id"});
  row.id = id ? site.text(*id, "the id") : std::to_string(site.line);
  const json* mode = site.first_of(object, {"mode"});
  row.mode = mode ? site.text(*mode, "the mode") : "-";
  if (const json* subject = site.first_of(object, {"subject", "type"}))
    row.subject = site.text(*subject, "subject");
  if (const json* level = site.first_of(object, {"level"})) {
    row.level = site.text(*level, "level");
    if (row.level.starts_with("Level ")) row.level = row.level.substr(6);
  }
  for (const char* key : {"ttft_ms", "e2e_ms"})
    if (const json* v = site.first_of(object, {key}); v && v->is_number())
      (std::string_view(key) == "ttft_ms" ? row.ttft_ms : row.e2e_ms) = v->get<double>();
  // Token counts (a results file of `choreo eval` has them; before, score printed zeros for them).
  for (auto [key, field] : {std::pair{"tokens_generated", &row.tokens_generated},
                            std::pair{"tokens_computed", &row.tokens_computed},
                            std::pair{"tokens_reused", &row.tokens_reused}})
    if (const json* v = site.first_of(object, {key}); v && v->is_number_integer()) *field = v->get<int64_t>();
  return row;
}

}  // namespace

std::vector<ResultRow> score_file(const std::string& path, Metric metric) {
  LineReader reader(path, "predictions file");
  std::vector<ResultRow> rows;
  std::map<std::pair<std::string, std::string>, int> seen;
  std::string line;
  while (reader.next(line)) {
    const int number = reader.line_number();
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    exec::JsonLine parsed = exec::parse_json_line(number, line);
    if (!parsed.json_error.empty())
      throw InputError(fmt::format("line is not JSON: {}", parsed.json_error),
                       "each line must be one JSON object",
                       SourceLocation{path, number, parsed.json_error_column()}, line);
    rows.push_back(score_line(parsed.value, LineSite{path, number}, metric));
    auto [it, fresh] = seen.emplace(std::make_pair(rows.back().id, rows.back().mode), number);
    if (!fresh)
      throw InputError(fmt::format("row id '{}' (mode '{}') was already given at line {}", rows.back().id,
                                   rows.back().mode, it->second),
                       "ids must be unique per mode; drop the \"id\" field to number rows by line",
                       SourceLocation{path, number, 0});
  }
  if (rows.empty())
    throw InputError(fmt::format("'{}' has no predictions", path), "an empty file cannot be scored",
                     SourceLocation{path, 0, 0});
  return rows;
}

}  // namespace choreo::eval
