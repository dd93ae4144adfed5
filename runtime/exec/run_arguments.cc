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
#include "runtime/common/error.h"

namespace choreo::exec {

namespace {

using dsl::ValueType;
using dsl::expr::Value;

std::string_view type_word(ValueType type) {
  switch (type) {
    case ValueType::String:
      return "string";
    case ValueType::Int:
      return "int";
    case ValueType::Float:
      return "float";
    case ValueType::Bool:
      return "bool";
    case ValueType::List:
      return "list";
  }
  return "value";
}

[[noreturn]] void wrong_type(std::string_view text, ValueType type, const std::string& what,
                             std::string hint) {
  throw InputError(fmt::format("{} must be {} {}, got '{}'", what, type == ValueType::Int ? "an" : "a",
                               type_word(type), text),
                   std::move(hint));
}

}  // namespace

Value convert_argument(std::string_view text, ValueType type, const std::string& what) {
  switch (type) {
    case ValueType::String:
      return Value::string(std::string(text));
    case ValueType::Int: {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size())
        wrong_type(text, type, what, "write a whole number such as 3");
      return Value::integer(v);
    }
    case ValueType::Float: {
      std::string copy(text);
      char* end = nullptr;
      const double v = copy.empty() ? 0 : std::strtod(copy.c_str(), &end);
      if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(v) || std::isspace(copy[0]))
        wrong_type(text, type, what, "write a finite number such as 0.5");
      return Value::floating(v);
    }
    case ValueType::Bool:
      if (text == "true") return Value::boolean(true);
      if (text == "false") return Value::boolean(false);
      wrong_type(text, type, what, "write exactly true or false");
    case ValueType::List: {
      // A list is written in the expression language (`[1, 'a']`), evaluated with nothing in scope.
      Value v;
      try {
        dsl::expr::Expr e = dsl::expr::parse_expression(text, SourceLocation{what, 0, 0});
        v = dsl::expr::evaluate(e, dsl::expr::MapScope{});
      } catch (const InputError&) {
        wrong_type(text, type, what, "write a list literal such as [1, 'two', 3.0]");
      }
      if (v.type() != dsl::expr::Type::List)
        wrong_type(text, type, what, "write a list literal such as [1, 2]");
      return v;
    }
  }
  wrong_type(text, type, what, {});
}

Value literal_value(const dsl::Literal& literal) {
  switch (literal.type) {
    case ValueType::String:
      return Value::string(literal.text);
    case ValueType::Int:
      return Value::integer(literal.int_value);
    case ValueType::Float:
      return Value::floating(literal.float_value);
    case ValueType::Bool:
      return Value::boolean(literal.bool_value);
    case ValueType::List: {
      dsl::expr::List items;
      for (const dsl::Literal& item : literal.items) items.push_back(literal_value(item));
      return Value::list(std::move(items));
    }
  }
  return Value();
}

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
                       fmt::format("pass --input {}=VALUE ({})", name, type_word(input.type)), input.where,
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
