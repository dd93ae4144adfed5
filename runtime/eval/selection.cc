#include "runtime/eval/selection.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"
#include "common/suggest.h"

namespace choreo::eval {

namespace {

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

Shard parse_shard(std::string_view text) {
  const size_t slash = text.find('/');
  const auto hint = "write --shard I/N with 0 <= I < N, e.g. --shard 0/4 for the first of four jobs";
  if (slash == std::string_view::npos) throw InputError(fmt::format("--shard '{}' is not I/N", text), hint);
  const std::optional<int> index = parse_int(text.substr(0, slash));
  const std::optional<int> count = parse_int(text.substr(slash + 1));
  if (!index || !count) throw InputError(fmt::format("--shard '{}' is not I/N with integers", text), hint);
  if (*count < 1 || *index < 0 || *index >= *count)
    throw InputError(fmt::format("--shard {}: the index must be in [0, {})", text, *count), hint);
  return Shard{*index, *count};
}

bool in_shard(size_t row_index, Shard shard) {
  return row_index % static_cast<size_t>(shard.count) == static_cast<size_t>(shard.index);
}

std::vector<Row> select_rows(const std::vector<Row>& rows, long limit, Shard shard) {
  const size_t taken = limit < 0 ? rows.size() : std::min(rows.size(), static_cast<size_t>(limit));
  std::vector<Row> out;
  for (size_t i = 0; i < taken; ++i)
    if (in_shard(i, shard)) out.push_back(rows[i]);
  return out;
}

InputMap InputMap::parse(const std::vector<std::string>& pairs) {
  InputMap out;
  for (const std::string& pair : pairs) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == pair.size())
      throw InputError(
          fmt::format("--map '{}' is not INPUT=FIELD", pair),
          "write e.g. --map problem=question to feed the row's `question` to the input `problem`");
    if (!out.input_to_field_.emplace(pair.substr(0, eq), pair.substr(eq + 1)).second)
      throw InputError(fmt::format("--map gives the input '{}' twice", pair.substr(0, eq)));
  }
  return out;
}

std::map<std::string, std::string> InputMap::apply(const Row& row,
                                                   const std::vector<std::string>& declared_inputs,
                                                   const std::string& data_path) const {
  for (const auto& [input, field] : input_to_field_) {
    if (std::find(declared_inputs.begin(), declared_inputs.end(), input) != declared_inputs.end()) continue;
    std::vector<std::string_view> names(declared_inputs.begin(), declared_inputs.end());
    throw InputError(with_suggestion(fmt::format("--map {}={}: the workflow has no input '{}'", input, field, input), input,
                                     names),
                     fmt::format("its inputs are {}", fmt::join(declared_inputs, ", ")));
  }
  std::map<std::string, std::string> out;
  for (const std::string& input : declared_inputs) {
    auto mapped = input_to_field_.find(input);
    const std::string& field = mapped == input_to_field_.end() ? input : mapped->second;
    auto it = row.fields.find(field);
    if (it != row.fields.end()) {
      out[input] = it->second;
      continue;
    }
    std::vector<std::string_view> names;
    for (const auto& [name, value] : row.fields) names.push_back(name);
    throw InputError(
        with_suggestion(fmt::format("row '{}' has no field '{}' for the workflow input '{}'", row.id, field, input),
                        field, names),
        fmt::format("the row's fields are {}; map one with --map {}=FIELD", fmt::join(names, ", "), input),
        SourceLocation{data_path, row.line, 0});
  }
  return out;
}

}  // namespace choreo::eval
