#include "dsl/expr/functions.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dsl/expr/arguments.h"
#include "dsl/expr/operators.h"

namespace choreo::dsl::expr {

namespace {

constexpr FunctionInfo kFunctions[] = {
    {"all", 1, 1, "1 argument", "all(list of bools)"},
    {"any", 1, 1, "1 argument", "any(list of bools)"},
    {"boxed", 1, 1, "1 argument", "boxed(text) -> string or null"},
    {"float", 1, 1, "1 argument", "float(x)"},
    {"index", 2, 2, "2 arguments", "index(list, value) -> int"},
    {"int", 1, 1, "1 argument", "int(x)"},
    {"join", 1, 2, "1 or 2 arguments", "join(list, separator='')"},
    {"json", 1, 1, "1 argument", "json(text) -> value"},
    {"len", 1, 1, "1 argument", "len(list, dict or text)"},
    {"lower", 1, 1, "1 argument", "lower(text)"},
    {"majority", 1, 1, "1 argument", "majority(list) -> most common element"},
    {"max", 1, -1, "at least 1 argument", "max(list) or max(a, b, ...)"},
    {"min", 1, -1, "at least 1 argument", "min(list) or min(a, b, ...)"},
    {"range", 1, 3, "1 to 3 arguments", "range(stop) or range(start, stop[, step])"},
    {"regex_capture", 2, 3, "2 or 3 arguments", "regex_capture(pattern, text[, group]) -> string or null"},
    {"regex_match", 2, 2, "2 arguments", "regex_match(pattern, text) -> bool"},
    {"sorted", 1, 1, "1 argument", "sorted(list)"},
    {"split", 1, 2, "1 or 2 arguments", "split(text[, separator])"},
    {"str", 1, 1, "1 argument", "str(x)"},
    {"strip", 1, 1, "1 argument", "strip(text)"},
    {"sum", 1, 1, "1 argument", "sum(list of numbers)"},
    {"upper", 1, 1, "1 argument", "upper(text)"},
};

Value range(const Arguments& args) {
  int64_t start = 0, stop = 0, step = 1;
  if (args.size() == 1) {
    stop = args.integer(0);
  } else {
    start = args.integer(0);
    stop = args.integer(1);
    if (args.size() == 3) step = args.integer(2);
  }
  if (step == 0) throw args.error(2, "range() step must not be zero");
  __int128 span = static_cast<__int128>(stop) - start;
  __int128 count = 0;
  if (step > 0 && span > 0) count = (span + step - 1) / step;
  if (step < 0 && span < 0) count = (-span + (-static_cast<__int128>(step)) - 1) / -static_cast<__int128>(step);
  if (count > static_cast<__int128>(args.context.limits().max_list_length))
    throw args.context.error(args.call_offset,
                             fmt::format("range() of {} elements is too long", static_cast<long double>(count)),
                             fmt::format("lists are limited to {} elements", args.context.limits().max_list_length));
  args.context.reserve_list(args.call_offset, static_cast<size_t>(count));
  args.context.step(args.call_offset, static_cast<int64_t>(count));
  List items;
  items.reserve(static_cast<size_t>(count));
  for (__int128 i = 0; i < count; ++i) items.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  return Value::list(std::move(items));
}

Value length(const Arguments& args) {
  const Value& v = args[0];
  if (v.type() == Type::List) return Value::integer(static_cast<int64_t>(v.as_list().size()));
  if (v.type() == Type::Dict) return Value::integer(static_cast<int64_t>(v.as_dict().size()));
  if (v.is_text()) {
    args.context.scan(args.offset(0), v.as_text().size());
    return Value::integer(static_cast<int64_t>(character_starts(v.as_text()).size() - 1));
  }
  args.wrong_type(0, "a list, dict or text");
}

// Most common element by ==; among equally common ones, the one whose first occurrence comes first.
Value majority(const Arguments& args) {
  const List& items = args.list(0);
  std::vector<std::pair<size_t, size_t>> counts;  // (index of first occurrence, count)
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t work = 0;
    auto it = std::find_if(counts.begin(), counts.end(),
                           [&](const auto& entry) { return equal(items[entry.first], items[i], &work, args.context.remaining_steps()); });
    args.context.step(args.call_offset, work + 1);
    if (it == counts.end())
      counts.emplace_back(i, 1);
    else
      ++it->second;
  }
  if (counts.empty()) return Value::null();
  auto best = counts.begin();
  for (auto it = counts.begin(); it != counts.end(); ++it)
    if (it->second > best->second) best = it;  // strict: ties keep the earlier first occurrence
  return items[best->first];
}

/// The elements min/max/sorted work on: one list argument, or the arguments themselves.
std::span<const Value> elements(const Arguments& args) {
  if (args.size() == 1) return args.list(0);
  return args.values;
}

Value extreme(const Arguments& args, bool want_max) {
  std::span<const Value> items = elements(args);
  if (items.empty()) throw args.error(0, fmt::format("{}() of an empty list", args.function.name));
  const Value* best = &items[0];
  for (const Value& item : items.subspan(1)) {
    args.context.step(args.call_offset);
    std::partial_ordering order = compare_values(item, *best, args.context, args.call_offset,
                                                 fmt::format("{}()", args.function.name));
    if (order == std::partial_ordering::unordered)
      throw args.context.error(args.call_offset, fmt::format("{}() of a list holding nan", args.function.name));
    if (want_max ? order > 0 : order < 0) best = &item;
  }
  return *best;
}

Value sorted(const Arguments& args) {
  List items = args.list(0);
  const size_t n = items.size();
  args.context.reserve_list(args.call_offset, n);
  int64_t log_n = 1;
  while ((size_t{1} << log_n) < n) ++log_n;
  args.context.step(args.call_offset, static_cast<int64_t>(n) * log_n);
  // NaN would break the strict weak order the sort relies on; mixed types throw from the comparator.
  for (const Value& item : items)
    if (item.type() == Type::Float && std::isnan(item.as_float()))
      throw args.error(0, "sorted() of a list holding nan");
  // Sort indices, not Values: stable_sort over the variant trips a GCC 12 false -Wmaybe-uninitialized.
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return compare_values(items[a], items[b], args.context, args.call_offset, "sorted()") < 0;
  });
  List out;
  out.reserve(n);
  for (size_t i : order) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value sum(const Arguments& args) {
  Value total = Value::integer(0);
  for (const Value& item : args.list(0)) {
    if (!item.is_number())
      throw args.error(0, fmt::format("sum() adds numbers; the list holds a {}", item.type_name()),
                       item.is_text() ? "join texts with join(list, separator)" : "");
    total = apply_binary(Op::Plus, total, item, args.context, args.call_offset);
  }
  return total;
}

Value any_or_all(const Arguments& args, bool is_any) {
  for (const Value& item : args.list(0)) {
    args.context.step(args.call_offset);
    if (item.type() != Type::Bool)
      throw args.error(0, fmt::format("{}() needs a list of bools; it holds a {}", args.function.name, item.type_name()),
                       "compare explicitly, e.g. any([x == 'yes' for x in votes])");
    if (item.as_bool() == is_any) return Value::boolean(is_any);
  }
  return Value::boolean(!is_any);
}

Value index_of(const Arguments& args) {
  const List& items = args.list(0);
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t work = 0;
    const bool found = equal(items[i], args[1], &work, args.context.remaining_steps());
    args.context.step(args.call_offset, work);
    if (found) return Value::integer(static_cast<int64_t>(i));
  }
  throw args.error(1, fmt::format("{} is not in the list", describe(args[1])),
                   "test membership first: x in list");
}

}  // namespace

const FunctionInfo* find_function(std::string_view name) {
  for (const FunctionInfo& f : kFunctions)
    if (f.name == name) return &f;
  return nullptr;
}

std::span<const std::string> function_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const FunctionInfo& f : kFunctions) out.emplace_back(f.name);
    return out;
  }();
  return names;
}

Value call_function(const FunctionInfo& function, std::span<const Value> arguments, Context& context,
                    size_t call_offset, std::span<const size_t> argument_offsets) {
  const Arguments args{function, arguments, context, call_offset, argument_offsets};
  const std::string_view name = function.name;
  if (name == "range") return range(args);
  if (name == "len") return length(args);
  if (name == "majority") return majority(args);
  if (name == "min") return extreme(args, false);
  if (name == "max") return extreme(args, true);
  if (name == "sorted") return sorted(args);
  if (name == "sum") return sum(args);
  if (name == "any") return any_or_all(args, true);
  if (name == "all") return any_or_all(args, false);
  if (name == "index") return index_of(args);
  Value result;
  if (call_text_function(name, args, &result)) return result;
  throw context.error(call_offset, fmt::format("function '{}' is not implemented", name));  // unreachable
}

}  // namespace choreo::dsl::expr
