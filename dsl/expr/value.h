#pragma once
// The values an expression computes with. Values are immutable and cheap to copy: strings, lists, dicts and
// message references are shared, so binding a list of 1,000 messages to a loop variable copies one pointer.
// Every list and dict records, when it is built, how deep it nests, how many elements it holds in all and where
// messages sit in it; building one past kMaxValueDepth or kMaxValueElements is an error. So every walk over a
// value (rendering, equality, JSON, destruction) recurses at most kMaxValueDepth levels and visits at most
// kMaxValueElements elements, however the value was built (a list shared twice inside another counts twice).

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

#include "common/error.h"

namespace choreo::dsl::expr {

class Value;

/// The deepest nesting of lists and dicts a value may have: a scalar is depth 0, `[1]` depth 1, `[[1]]` depth 2.
/// The one nesting limit for expression values, expression text (brackets) and JSON text (json(), JSON-lines
/// inputs: rejected before it is parsed). It bounds the recursion of every walk over a value to a few KiB of
/// stack per level; docs/expressions.md, "Bounds".
inline constexpr int kMaxValueDepth = 64;

/// The most elements one value may hold, counting the elements of nested lists and dicts (each time a shared
/// sublist appears). Bounds the work of any walk over a value, such as flattening a parent list.
inline constexpr uint64_t kMaxValueElements = 1'000'000;

/// Building a list or dict past kMaxValueDepth or kMaxValueElements. An InputError without a location:
/// evaluation re-throws it at the expression that built the value; other builders add their own location.
class ValueLimitError : public InputError {
 public:
  using InputError::InputError;
};

/// A list value (elements in order).
using List = std::vector<Value>;
/// A dict value: string keys, kept sorted (like the JSON objects json() returns).
using Dict = std::map<std::string, Value, std::less<>>;

/// The host's handle on a message in the KV store: `id` is the host's, `text` is what string functions see.
struct MessageRef {
  uint64_t id = 0;
  std::string text;
  bool text_known = true;  ///< false: the host does not know the text yet (`choreo check`'s decodes); reads as ""
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
  const List& as_list() const { return std::get<std::shared_ptr<const Composite<List>>>(data_)->items; }
  const Dict& as_dict() const { return std::get<std::shared_ptr<const Composite<Dict>>>(data_)->items; }
  const MessageRef& as_message() const { return *std::get<std::shared_ptr<const MessageRef>>(data_); }

  /// What a value holds, as recorded when it was built.
  struct Summary {
    int depth = 0;                     ///< nesting of lists and dicts (a scalar: 0)
    uint64_t elements = 0;             ///< elements at every depth, shared ones counted each time
    uint64_t message_depths = 0;       ///< bit k: a message sits at depth k (bit 63: at 63 or deeper)
    uint64_t unknown_text_depths = 0;  ///< the same for messages whose text is not known
  };
  Summary summary() const;
  int depth() const { return summary().depth; }

  /// The storage a list or dict shares with its copies (null for other values): equal pointers, same value.
  const void* identity() const;

  /// The list's elements for building a changed copy: moved out when this is the only reference to them,
  /// copied otherwise (values stay immutable to everyone else).
  List release_list() &&;

 private:
  template <class Items>
  struct Composite {
    Items items;
    Summary summary;
  };

  std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const Composite<List>>, std::shared_ptr<const Composite<Dict>>,
               std::shared_ptr<const MessageRef>>
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
/// render() for text that must fit `max_bytes` (a message's text): a ValueLimitError when it would not. A value
/// of 10^6 elements sharing one long string would otherwise render to terabytes.
std::string render_within(const Value& value, size_t max_bytes);

/// JSON text of a value (messages as their text; non-finite floats as null).
std::string to_json(const Value& value);

/// Calls `visit(offset, c)` for each character of JSON text from `from` on that is outside string literals
/// (an opening quote is visited, the string's content and closing quote are not) until it returns false.
/// The one string-skipping scan of the bracket checks on JSON text.
template <class Visit>
void scan_json_outside_strings(std::string_view json, size_t from, Visit visit) {
  bool in_string = false;
  for (size_t i = from; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    in_string = c == '"';
    if (!visit(i, c)) return;
  }
}

/// The byte offset of the first `[` or `{` of JSON text that opens a level deeper than `max_depth` (brackets
/// inside strings do not count), or npos. Lets readers reject over-deep JSON in one pass before a parser
/// builds, walks or frees it recursively; the text need not be valid JSON.
size_t find_too_deep_json(std::string_view json, int max_depth = kMaxValueDepth);

/// A short quotation of a value for error messages, e.g. 'ansewr' or [1, 2, ...] (at most ~40 characters).
std::string describe(const Value& value);

/// `current[i][j]... = value` on immutable values: a copy of `current` with the lists along the path copied and
/// padded with nulls as needed (a non-list on the path becomes a list). How a fan-out's `as: name` binds each
/// branch's result; the interpreter and the plan compiler (dsl/plan) must bind the same way.
Value assign_at(const Value& current, std::span<const int64_t> indices, const Value& value);

/// One `target[indices...] = value` of assign_all.
struct Assignment {
  std::vector<int64_t> indices;
  Value value;
};

/// Every assignment applied to `current` in order, as repeated assign_at would, but copying each list on the
/// paths once (a fan-out of n branches costs O(n), not O(n^2)), and not at all when `current` is the only
/// reference to it. Throws ValueLimitError when the result is too deep or too large.
Value assign_all(Value current, std::span<const Assignment> assignments);

}  // namespace choreo::dsl::expr
