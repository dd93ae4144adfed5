#include "dsl/expr/operators.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace choreo::dsl::expr {

namespace {

[[noreturn]] void type_error(Op op, const Value& left, const Value& right, Context& context, size_t offset) {
  std::string hint;
  if (left.is_text() && right.is_number())
    hint = "convert the number with str(x) to join them as text";
  else if (left.is_number() && right.is_text())
    hint = "convert the text with int(s) or float(s), or the number with str(x)";
  else if (left.is_null() || right.is_null())
    hint = "a value is null (e.g. boxed() or regex_capture() found nothing); test it with x != null";
  else if (left.type() == Type::Bool || right.type() == Type::Bool)
    hint = "bools are not numbers; use 1 if b else 0";
  throw context.error(offset,
                      fmt::format("cannot apply '{}' to {} and {}", spelling(op), left.type_name(), right.type_name()),
                      hint);
}

Value checked_float(double result, const Value& left, const Value& right, Op op, Context& context, size_t offset) {
  if (!std::isfinite(result) && std::isfinite(left.as_number()) && std::isfinite(right.as_number()))
    throw context.error(offset, fmt::format("float result of '{}' is out of range or undefined", spelling(op)));
  return Value::floating(result);
}

Value integer_power(int64_t base, int64_t exponent, Context& context, size_t offset) {
  int64_t result = 1;
  while (exponent > 0) {
    context.step(offset);
    if (exponent & 1)
      if (__builtin_mul_overflow(result, base, &result))
        throw context.error(offset, "integer overflow in '**'", "integers are 64-bit; use a float base (2.0 ** 100)");
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base))
      throw context.error(offset, "integer overflow in '**'", "integers are 64-bit; use a float base (2.0 ** 100)");
  }
  return Value::integer(result);
}

Value float_arithmetic(Op op, const Value& left, const Value& right, Context& context, size_t offset);

Value integer_arithmetic(Op op, int64_t a, int64_t b, Context& context, size_t offset) {
  int64_t result = 0;
  bool overflow = false;
  switch (op) {
    case Op::Plus: overflow = __builtin_add_overflow(a, b, &result); break;
    case Op::Minus: overflow = __builtin_sub_overflow(a, b, &result); break;
    case Op::Multiply: overflow = __builtin_mul_overflow(a, b, &result); break;
    case Op::Divide:
      if (b == 0) throw context.error(offset, "division by zero");
      return Value::floating(static_cast<double>(a) / static_cast<double>(b));
    case Op::FloorDivide:
    case Op::Modulo: {
      if (b == 0) throw context.error(offset, op == Op::Modulo ? "modulo by zero" : "division by zero");
      if (a == std::numeric_limits<int64_t>::min() && b == -1) {
        if (op == Op::Modulo) return Value::integer(0);
        overflow = true;
        break;
      }
      int64_t quotient = a / b, remainder = a % b;
      if (remainder != 0 && ((remainder < 0) != (b < 0))) {  // floor, as Python does
        --quotient;
        remainder += b;
      }
      return Value::integer(op == Op::Modulo ? remainder : quotient);
    }
    case Op::Power:
      // A negative exponent gives a float, computed (and checked) as the float operator does: 0 ** -1 is an error.
      if (b < 0) return float_arithmetic(op, Value::integer(a), Value::integer(b), context, offset);
      return integer_power(a, b, context, offset);
    default: break;
  }
  if (overflow)
    throw context.error(offset, fmt::format("integer overflow in '{}'", spelling(op)),
                        "integers are 64-bit (at most 9223372036854775807); use floats for larger values");
  return Value::integer(result);
}

Value float_arithmetic(Op op, const Value& left, const Value& right, Context& context, size_t offset) {
  const double a = left.as_number(), b = right.as_number();
  switch (op) {
    case Op::Plus: return checked_float(a + b, left, right, op, context, offset);
    case Op::Minus: return checked_float(a - b, left, right, op, context, offset);
    case Op::Multiply: return checked_float(a * b, left, right, op, context, offset);
    case Op::Divide:
      if (b == 0) throw context.error(offset, "division by zero");
      return checked_float(a / b, left, right, op, context, offset);
    case Op::FloorDivide:
      if (b == 0) throw context.error(offset, "division by zero");
      return checked_float(std::floor(a / b), left, right, op, context, offset);
    case Op::Modulo: {
      if (b == 0) throw context.error(offset, "modulo by zero");
      double r = std::fmod(a, b);
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      return checked_float(r, left, right, op, context, offset);
    }
    case Op::Power:
      if (a == 0 && b < 0) throw context.error(offset, "zero to a negative power");
      return checked_float(std::pow(a, b), left, right, op, context, offset);
    default: break;
  }
  type_error(op, left, right, context, offset);
}

Value repeat(const Value& sequence, int64_t count, Context& context, size_t offset) {
  const size_t n = count > 0 ? static_cast<size_t>(count) : 0;
  if (sequence.is_text()) {
    const std::string& text = sequence.as_text();
    if (text.empty()) return Value::string("");  // any count: no work, however large
    if (n > context.limits().max_string_bytes / text.size())
      context.reserve_string(offset, context.limits().max_string_bytes + 1);  // throws
    context.reserve_string(offset, text.size() * n);
    std::string out;
    out.reserve(text.size() * n);
    for (size_t i = 0; i < n; ++i) out += text;
    return Value::string(std::move(out));
  }
  const List& items = sequence.as_list();
  if (items.empty()) return Value::list({});
  if (n > context.limits().max_list_length / items.size())
    context.reserve_list(offset, context.limits().max_list_length + 1);  // throws
  context.reserve_list(offset, items.size() * n);
  List out;
  out.reserve(items.size() * n);
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out));
}

Value arithmetic(Op op, const Value& left, const Value& right, Context& context, size_t offset) {
  if (left.type() == Type::Int && right.type() == Type::Int)
    return integer_arithmetic(op, left.as_int(), right.as_int(), context, offset);
  if (left.is_number() && right.is_number()) return float_arithmetic(op, left, right, context, offset);
  if (op == Op::Plus && left.is_text() && right.is_text()) {
    context.reserve_string(offset, left.as_text().size() + right.as_text().size());
    return Value::string(left.as_text() + right.as_text());
  }
  if (op == Op::Plus && left.type() == Type::List && right.type() == Type::List) {
    context.reserve_list(offset, left.as_list().size() + right.as_list().size());
    List out = left.as_list();
    out.insert(out.end(), right.as_list().begin(), right.as_list().end());
    return Value::list(std::move(out));
  }
  if (op == Op::Multiply) {
    const bool left_sequence = left.is_text() || left.type() == Type::List;
    const bool right_sequence = right.is_text() || right.type() == Type::List;
    if (left_sequence && right.type() == Type::Int) return repeat(left, right.as_int(), context, offset);
    if (right_sequence && left.type() == Type::Int) return repeat(right, left.as_int(), context, offset);
  }
  type_error(op, left, right, context, offset);
}

Value membership(const Value& needle, const Value& haystack, Context& context, size_t offset) {
  if (haystack.is_text()) {
    if (!needle.is_text())
      throw context.error(offset, fmt::format("'in' on a {} needs a text on the left, got {}", haystack.type_name(),
                                              needle.type_name()),
                          "convert it with str(x)");
    context.scan(offset, haystack.as_text().size());
    return Value::boolean(haystack.as_text().find(needle.as_text()) != std::string::npos);
  }
  if (haystack.type() == Type::List) {
    int64_t work = 0;
    bool found = false;
    for (const Value& item : haystack.as_list()) {
      work = 0;
      found = equal(item, needle, &work, context.remaining_steps());
      context.step(offset, work);
      if (found) break;
    }
    return Value::boolean(found);
  }
  if (haystack.type() == Type::Dict) {
    if (!needle.is_text())
      throw context.error(offset, fmt::format("dict keys are strings; cannot look up a {}", needle.type_name()));
    return Value::boolean(haystack.as_dict().count(needle.as_text()) > 0);
  }
  throw context.error(offset, fmt::format("'in' needs a list, dict or text on the right, got {}", haystack.type_name()));
}

/// Resolves a Python-style index (negative counts from the end) against `length`, or throws.
size_t resolve_index(const Value& index, size_t length, std::string_view what, Context& context, size_t offset) {
  if (index.type() != Type::Int)
    throw context.error(offset, fmt::format("{} index must be an int, got {}", what, index.type_name()),
                        index.type() == Type::Float ? "convert with int(x)" : "");
  const int64_t i = index.as_int();
  const int64_t n = static_cast<int64_t>(length);
  if (i >= n || i < -n)
    throw context.error(offset, fmt::format("index {} is out of range for a {} of length {}", i, what, length),
                        length == 0 ? fmt::format("the {} is empty", what)
                                    : fmt::format("valid indices are 0..{} (or -{}..-1 from the end)", n - 1, n));
  return static_cast<size_t>(i < 0 ? i + n : i);
}

}  // namespace

std::vector<size_t> character_starts(std::string_view text) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size(); ++i)
    if (i == 0 || (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(text.size());
  return starts;
}

std::partial_ordering compare_values(const Value& left, const Value& right, Context& context, size_t offset,
                                     std::string_view what) {
  if (left.type() == Type::Int && right.type() == Type::Int) return left.as_int() <=> right.as_int();
  if (left.type() == Type::Int && right.type() == Type::Float) return compare_int_float(left.as_int(), right.as_float());
  if (left.type() == Type::Float && right.type() == Type::Int)
    return 0 <=> compare_int_float(right.as_int(), left.as_float());
  if (left.is_number() && right.is_number()) return left.as_float() <=> right.as_float();
  if (left.is_text() && right.is_text()) {
    context.scan(offset, std::min(left.as_text().size(), right.as_text().size()));
    return left.as_text().compare(right.as_text()) <=> 0;
  }
  if (left.type() == Type::Bool && right.type() == Type::Bool) return left.as_bool() <=> right.as_bool();
  if (left.type() == Type::List && right.type() == Type::List) {
    const List& a = left.as_list();
    const List& b = right.as_list();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      context.step(offset);
      std::partial_ordering order = compare_values(a[i], b[i], context, offset, what);
      if (order != std::partial_ordering::equivalent) return order;
    }
    return a.size() <=> b.size();
  }
  throw context.error(offset, fmt::format("cannot compare {} and {} with {}", left.type_name(), right.type_name(), what),
                      left.is_null() || right.is_null() ? "a value is null; test it with x != null first" : "");
}

Value apply_binary(Op op, const Value& left, const Value& right, Context& context, size_t offset) {
  switch (op) {
    case Op::Equal:
    case Op::NotEqual: {
      int64_t work = 0;
      bool same = equal(left, right, &work, context.remaining_steps());
      context.step(offset, work);
      return Value::boolean(op == Op::Equal ? same : !same);
    }
    case Op::Less:
    case Op::LessEqual:
    case Op::Greater:
    case Op::GreaterEqual: {
      std::partial_ordering order = compare_values(left, right, context, offset, fmt::format("'{}'", spelling(op)));
      switch (op) {
        case Op::Less: return Value::boolean(order < 0);
        case Op::LessEqual: return Value::boolean(order <= 0);
        case Op::Greater: return Value::boolean(order > 0);
        default: return Value::boolean(order >= 0);
      }
    }
    case Op::In: return membership(left, right, context, offset);
    case Op::NotIn: return Value::boolean(!membership(left, right, context, offset).as_bool());
    default: return arithmetic(op, left, right, context, offset);
  }
}

Value index_value(const Value& object, const Value& index, Context& context, size_t offset) {
  switch (object.type()) {
    case Type::List: return object.as_list()[resolve_index(index, object.as_list().size(), "list", context, offset)];
    case Type::String:
    case Type::Message: {
      context.scan(offset, object.as_text().size());
      std::vector<size_t> starts = character_starts(object.as_text());
      size_t i = resolve_index(index, starts.size() - 1, "text", context, offset);
      return Value::string(object.as_text().substr(starts[i], starts[i + 1] - starts[i]));
    }
    case Type::Dict: {
      if (!index.is_text())
        throw context.error(offset, fmt::format("dict keys are strings; cannot index with a {}", index.type_name()));
      const Dict& dict = object.as_dict();
      auto it = dict.find(index.as_text());
      if (it != dict.end()) return it->second;
      std::vector<std::string> keys;
      for (const auto& entry : dict) keys.push_back(entry.first);
      std::string listed;
      for (size_t i = 0; i < keys.size() && i < 10; ++i) listed += (i ? ", " : "") + keys[i];
      if (keys.size() > 10) listed += ", ...";
      throw context.error(offset,
                          with_suggestion(fmt::format("no key '{}' in the dict", index.as_text()), index.as_text(), keys),
                          keys.empty() ? "the dict is empty" : "keys: " + listed);
    }
    case Type::Null:
      throw context.error(offset, "cannot index null",
                          "the value is missing (e.g. boxed() or regex_capture() found nothing); test x != null");
    default:
      throw context.error(offset, fmt::format("cannot index a {}", object.type_name()),
                          "only lists, texts and dicts can be indexed");
  }
}

Value slice_value(const Value& object, const Value& start, const Value& stop, Context& context, size_t offset) {
  const bool is_text = object.is_text();
  if (!is_text && object.type() != Type::List)
    throw context.error(offset, fmt::format("cannot slice a {}", object.type_name()), "only lists and texts can be sliced");
  std::vector<size_t> starts;
  if (is_text) {
    context.scan(offset, object.as_text().size());
    starts = character_starts(object.as_text());
  }
  const int64_t length = static_cast<int64_t>(is_text ? starts.size() - 1 : object.as_list().size());
  auto bound = [&](const Value& v, int64_t fallback) -> int64_t {
    if (v.is_null()) return fallback;
    if (v.type() != Type::Int)
      throw context.error(offset, fmt::format("slice bounds must be ints, got {}", v.type_name()));
    int64_t i = v.as_int();
    if (i < 0) i = std::max<int64_t>(0, i + length);
    return std::min(i, length);
  };
  const int64_t begin = bound(start, 0);
  const int64_t end = std::max(begin, bound(stop, length));
  if (is_text) {
    std::string text = object.as_text().substr(starts[begin], starts[end] - starts[begin]);
    return context.make_string(offset, std::move(text));
  }
  context.reserve_list(offset, static_cast<size_t>(end - begin));
  return Value::list(List(object.as_list().begin() + begin, object.as_list().begin() + end));
}

}  // namespace choreo::dsl::expr
