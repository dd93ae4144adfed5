#include "dsl/arguments.h"

#include <fmt/ranges.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/error.h"
#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/source.h"

namespace choreo::dsl {

std::string_view value_type_name(ValueType type) {
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

namespace {

using dsl::expr::Value;

constexpr size_t kQuotedArgumentBytes = 160;

/// The text is quoted cut short (a list input can be a whole JSON-lines row), followed by `reason` when the
/// expression reader gave one (e.g. a list past kMaxValueElements, which is well-formed).
[[noreturn]] void wrong_type(std::string_view text, ValueType type, const std::string& what, std::string hint,
                             const std::string& reason = {}) {
  throw InputError(fmt::format("{} must be {} {}, got '{}'{}", what, type == ValueType::Int ? "an" : "a",
                               value_type_name(type), clip_text(text, kQuotedArgumentBytes),
                               reason.empty() ? "" : ": " + reason),
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
      } catch (const InputError& e) {
        wrong_type(text, type, what, "write a list literal such as [1, 'two', 3.0]", e.message());
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

}  // namespace choreo::dsl
