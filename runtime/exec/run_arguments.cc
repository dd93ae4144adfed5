#include "runtime/exec/run_arguments.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <vector>

#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/source.h"
#include "common/error.h"

namespace choreo::exec {

namespace {

using dsl::ValueType;
using dsl::expr::Value;

}  // namespace


std::map<std::string, Value, std::less<>> bind_arguments(const dsl::Workflow& workflow,
                                                         const RunArguments& arguments) {
  std::map<std::string, Value, std::less<>> out;
  std::vector<std::string> input_names, param_names;
  std::set<std::string, std::less<>> fields;
  for (const dsl::Message& m : workflow.messages)
    if (m.field) fields.insert(m.field->value);

  for (const dsl::Input& input : workflow.inputs) input_names.push_back(input.name.value);
  for (const auto& [key, text] : arguments.inputs) {
    if (std::find(input_names.begin(), input_names.end(), key) != input_names.end()) continue;
    if (fields.count(key)) {
      out[key] = Value::string(text);
      continue;
    }
    std::vector<std::string> candidates = input_names;
    candidates.insert(candidates.end(), fields.begin(), fields.end());
    throw InputError(dsl::expr::with_suggestion(fmt::format("unknown input `{}`", key), key, candidates),
                     candidates.empty() ? "this workflow declares no inputs"
                                        : fmt::format("the inputs are: {}", fmt::join(candidates, ", ")));
  }

  for (const dsl::Input& input : workflow.inputs) {
    const std::string& name = input.name.value;
    auto given = arguments.inputs.find(name);
    if (given == arguments.inputs.end())
      throw InputError(fmt::format("input `{}` has no value", name),
                       fmt::format("pass --input {}=VALUE ({})", name, dsl::value_type_name(input.type)), input.where,
                       workflow.source_line(input.where.line));
    out[name] = convert_argument(given->second, input.type, fmt::format("input `{}`", name));
  }
  for (const dsl::Param& param : workflow.params) param_names.push_back(param.name.value);
  for (const auto& [key, text] : arguments.params) {
    if (std::find(param_names.begin(), param_names.end(), key) != param_names.end()) continue;
    throw InputError(dsl::expr::with_suggestion(fmt::format("unknown param `{}`", key), key, param_names),
                     param_names.empty() ? "this workflow declares no params"
                                         : fmt::format("the params are: {}", fmt::join(param_names, ", ")));
  }
  for (const dsl::Param& param : workflow.params) {
    const std::string& name = param.name.value;
    auto given = arguments.params.find(name);
    out[name] = given == arguments.params.end()
                    ? literal_value(param.value)
                    : convert_argument(given->second, param.value.type, fmt::format("param `{}`", name));
  }
  return out;
}

}  // namespace choreo::exec
