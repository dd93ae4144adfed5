#pragma once
// The values an expression computes with. Values are immutable and cheap to copy: strings, lists, dicts and
// message references are shared, so binding a list of 1,000 messages to a loop variable copies one pointer.

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace choreo::dsl::expr {

class Value;

/// A list value (elements in order).
using List = std::vector<Value>;
/// A dict value: string keys, kept sorted (like the JSON objects json() returns).
using Dict = std::map<std::string, Value, std::less<>>;

/// The host's handle on a message in the KV store: `id` is the host's, `text` is what string functions see.
struct MessageRef {
  uint64_t id = 0;
  std::string text;
};

/// The kinds of value, in the order their names appear in error messages.
enum class Type { Null, Bool, Int, Float, String, List, Dict, Message };

/// "null", "bool", "int", "float", "string", "list", "dict" or "message".
std::string_view type_name(Type type);

/// One expression value: null, bool, int (64-bit), float (double), string, list, dict or message reference.
class Value {
 public:
  Value() = default;
  static Value null() { return Value(); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double d);
  static Value string(std::string s);
  static Value list(List items);
  static Value dict(Dict items);
  static Value message(MessageRef ref);

  Type type() const { return static_cast<Type>(data_.index()); }
  std::string_view type_name() const { return expr::type_name(type()); }
  bool is_null() const { return type() == Type::Null; }
  bool is_number() const { return type() == Type::Int || type() == Type::Float; }
  /// True for strings and message references (both read as text).
  bool is_text() const { return type() == Type::String || type() == Type::Message; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  /// An int or float as a double.
  double as_number() const;
  /// The text of a string or of a message reference.
  const std::string& as_text() const;
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  const MessageRef& as_message() const { return *std::get<std::shared_ptr<const MessageRef>>(data_); }

 private:
  std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<const MessageRef>>
      data_;
};

/// Equality as `==` computes it: ints and floats compare numerically, strings and messages by text, lists and
/// dicts element-wise; values of other different types are unequal (never an error). When `work` is given,
/// adds the number of elements compared plus bytes/64 of text compared (for the evaluator's step budget), and
/// gives up (the answer is then meaningless) once *work passes `work_limit`; the caller's budget check fails.
bool equal(const Value& a, const Value& b, int64_t* work = nullptr, int64_t work_limit = INT64_MAX);

/// Exact three-way comparison of an int with a float (no rounding of large ints); NaN is unordered.
std::partial_ordering compare_int_float(int64_t i, double d);

/// A float in shortest round-trip form that still reads as a float: 2.0 -> "2.0", 0.1 -> "0.1", 1e+100,
/// "inf", "-inf", "nan".
std::string format_float(double d);

/// How a value reads in text (templates and str()): strings and messages as their text, null as "", bools
/// as true/false, numbers in shortest round-trip form, lists and dicts as JSON.
std::string render(const Value& value);
/// render() that gives up (nullopt) once the text would pass `max_bytes`.
std::optional<std::string> render_limited(const Value& value, size_t max_bytes);

/// JSON text of a value (messages as their text; non-finite floats as null).
std::string to_json(const Value& value);

/// A short quotation of a value for error messages, e.g. 'ansewr' or [1, 2, ...] (at most ~40 characters).
std::string describe(const Value& value);

/// `current[i][j]... = value` on immutable values: a copy of `current` with the lists along the path copied and
/// padded with nulls as needed (a non-list on the path becomes a list). How a fan-out's `as: name` binds each
/// branch's result; the interpreter and the plan compiler (dsl/plan) must bind the same way.
Value assign_at(const Value& current, std::span<const int64_t> indices, const Value& value);

}  // namespace choreo::dsl::expr
