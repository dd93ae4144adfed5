// The text half of the function library: strip, lower, upper, split, join, str, int, float, regex_match,
// regex_capture, json and boxed.

#include <charconv>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/regex.h"
#include "dsl/expr/arguments.h"

namespace choreo::dsl::expr {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

Value change_case(const Arguments& args, bool to_upper) {
  std::string text = args.text(0);
  args.context.reserve_string(args.call_offset, text.size());
  for (char& c : text) {
    if (to_upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (!to_upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return Value::string(std::move(text));
}

Value split(const Arguments& args) {
  const std::string& text = args.text(0);
  args.context.scan(args.call_offset, text.size());
  List parts;
  auto add = [&](std::string_view part) {
    args.context.check_list_length(args.call_offset, parts.size() + 1);
    args.context.step(args.call_offset);
    parts.push_back(Value::string(std::string(part)));
  };
  if (args.size() == 1) {  // runs of whitespace, ignoring leading and trailing whitespace
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && is_space(text[i])) ++i;
      size_t j = i;
      while (j < text.size() && !is_space(text[j])) ++j;
      if (j > i) add(std::string_view(text).substr(i, j - i));
      i = j;
    }
  } else {
    const std::string& separator = args.text(1);
    if (separator.empty()) throw args.error(1, "split() separator is empty", "omit it to split on whitespace");
    size_t start = 0;
    while (true) {
      size_t at = text.find(separator, start);
      if (at == std::string::npos) break;
      add(std::string_view(text).substr(start, at - start));
      start = at + separator.size();
    }
    add(std::string_view(text).substr(start));
  }
  args.context.reserve_string(args.call_offset, text.size());
  return args.context.make_list(args.call_offset, std::move(parts));
}

Value join(const Arguments& args) {
  const List& items = args.list(0);
  const std::string separator = args.size() == 2 ? args.text(1) : std::string();
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    args.context.step(args.call_offset);
    const size_t room = args.context.limits().max_string_bytes - std::min(out.size(), args.context.limits().max_string_bytes);
    std::optional<std::string> piece = render_limited(items[i], room);
    if (!piece) args.context.check_string_length(args.call_offset, args.context.limits().max_string_bytes + 1);
    args.context.check_string_length(args.call_offset, out.size() + piece->size() + separator.size());
    if (i > 0) out += separator;
    out += *piece;
  }
  return args.context.make_string(args.call_offset, std::move(out));
}

Value to_int(const Arguments& args) {
  const Value& v = args[0];
  switch (v.type()) {
    case Type::Int: return v;
    case Type::Bool: return Value::integer(v.as_bool() ? 1 : 0);
    case Type::Float: {
      const double d = std::trunc(v.as_float());
      if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
        throw args.error(0, fmt::format("int() of {} is out of range", format_float(v.as_float())),
                         "ints are 64-bit");
      return Value::integer(static_cast<int64_t>(d));
    }
    case Type::String:
    case Type::Message: {
      std::string_view s = trim(v.as_text());
      if (!s.empty() && s.front() == '+') s.remove_prefix(1);
      int64_t out = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
      if (s.empty() || ec != std::errc() || ptr != s.data() + s.size())
        throw args.error(0, fmt::format("int() cannot read {} as an integer", describe(Value::string(std::string(s)))),
                         ec == std::errc::result_out_of_range ? "ints are 64-bit" : "extract the digits first, e.g. regex_capture(r'-?\\d+', x, 0)");
      return Value::integer(out);
    }
    default: args.wrong_type(0, "a number, bool or text");
  }
}

Value to_float(const Arguments& args) {
  const Value& v = args[0];
  switch (v.type()) {
    case Type::Float: return v;
    case Type::Int: return Value::floating(static_cast<double>(v.as_int()));
    case Type::Bool: return Value::floating(v.as_bool() ? 1.0 : 0.0);
    case Type::String:
    case Type::Message: {
      std::string_view s = trim(v.as_text());
      if (!s.empty() && s.front() == '+') s.remove_prefix(1);
      double out = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
      if (s.empty() || ec != std::errc() || ptr != s.data() + s.size())
        throw args.error(0, fmt::format("float() cannot read {} as a number", describe(Value::string(std::string(s)))));
      return Value::floating(out);
    }
    default: args.wrong_type(0, "a number, bool or text");
  }
}

Value regex_call(const Arguments& args, bool capture) {
  const std::string& pattern = args.text(0);
  const std::string& subject = args.text(1);
  args.context.step(args.call_offset, args.context.limits().regex_call_steps);
  args.context.scan(args.call_offset, subject.size());
  const Regex& regex = args.context.regex(args.offset(0), pattern);
  int group = 0;
  if (capture) {
    group = regex.group_count() > 0 ? 1 : 0;
    if (args.size() == 3) {
      if (args[2].type() == Type::Int) {
        const int64_t n = args[2].as_int();
        if (n < 0 || n > static_cast<int64_t>(regex.group_count()))
          throw args.error(2, fmt::format("the pattern has no group {}", n),
                           fmt::format("it has {} groups (0 is the whole match)", regex.group_count()));
        group = static_cast<int>(n);
      } else if (args[2].is_text()) {
        group = regex.group_number(args[2].as_text());
        if (group < 0) throw args.error(2, fmt::format("the pattern has no group named '{}'", args[2].as_text()));
      } else {
        args.wrong_type(2, "a group number or name");
      }
    }
  }
  std::optional<std::string> captured;
  switch (regex.search(subject, group, capture ? &captured : nullptr)) {
    case Regex::Outcome::LimitExceeded:
      throw args.context.error(args.call_offset, "regex match limit exceeded (too much backtracking)",
                               "simplify the pattern, e.g. avoid nested quantifiers like (a+)+");
    case Regex::Outcome::NoMatch: return capture ? Value::null() : Value::boolean(false);
    case Regex::Outcome::Match: break;
  }
  if (!capture) return Value::boolean(true);
  if (!captured) return Value::null();
  return args.context.make_string(args.call_offset, std::move(*captured));
}

Value from_json(const nlohmann::json& j, Context& context, size_t offset) {
  context.step(offset);
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::null();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::floating(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::json::value_t::string: return context.make_string(offset, j.get<std::string>());
    case nlohmann::json::value_t::array: {
      context.reserve_list(offset, j.size());
      List items;
      for (const auto& item : j) items.push_back(from_json(item, context, offset));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict items;
      for (const auto& [key, item] : j.items()) items.emplace(key, from_json(item, context, offset));
      return Value::dict(std::move(items));
    }
    default: throw context.error(offset, "json() met a value it cannot represent");
  }
}

Value json(const Arguments& args) {
  const std::string& text = args.text(0);
  args.context.scan(args.call_offset, text.size() * 4);  // parsing builds a tree several times the text
  // Rejected before parsing: nlohmann and from_json() recurse once per level.
  if (find_too_deep_json(text) != std::string_view::npos)
    throw args.error(0, fmt::format("json() input nests lists and objects more than {} levels deep", kMaxValueDepth),
                     "values nest at most that deep");
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    std::string message = e.what();
    if (size_t at = message.find("] "); at != std::string::npos) message = message.substr(at + 2);
    throw args.error(0, "json() cannot parse its input: " + message,
                     "extract the JSON part first, e.g. regex_capture(r'\\{.*\\}', x, 0)");
  }
  return from_json(parsed, args.context, args.call_offset);
}

}  // namespace

std::optional<std::string> last_boxed(std::string_view text) {
  size_t best = std::string_view::npos;
  for (std::string_view command : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    size_t at = text.rfind(command);
    while (at != std::string_view::npos) {
      size_t brace = at + command.size();
      while (brace < text.size() && text[brace] == ' ') ++brace;
      if (brace < text.size() && text[brace] == '{') {
        if (best == std::string_view::npos || brace > best) best = brace;
        break;
      }
      at = at == 0 ? std::string_view::npos : text.rfind(command, at - 1);  // e.g. "\boxeds" is not a box
    }
  }
  if (best == std::string_view::npos) return std::nullopt;
  int depth = 0;
  for (size_t i = best; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return std::string(text.substr(best + 1, i - best - 1));
  }
  return std::nullopt;  // never closed (e.g. generation stopped mid-answer)
}

bool call_text_function(std::string_view name, const Arguments& args, Value* result) {
  if (name == "strip") {
    std::string_view s = trim(args.text(0));
    *result = args.context.make_string(args.call_offset, std::string(s));
  } else if (name == "lower" || name == "upper") {
    *result = change_case(args, name == "upper");
  } else if (name == "split") {
    *result = split(args);
  } else if (name == "join") {
    *result = join(args);
  } else if (name == "str") {
    if (args[0].type() == Type::String) {
      *result = args[0];
    } else {
      std::optional<std::string> text = render_limited(args[0], args.context.limits().max_string_bytes);
      if (!text) args.context.reserve_string(args.call_offset, args.context.limits().max_string_bytes + 1);  // throws
      *result = args.context.make_string(args.call_offset, std::move(*text));
    }
  } else if (name == "int") {
    *result = to_int(args);
  } else if (name == "float") {
    *result = to_float(args);
  } else if (name == "regex_match" || name == "regex_capture") {
    *result = regex_call(args, name == "regex_capture");
  } else if (name == "json") {
    *result = json(args);
  } else if (name == "boxed") {
    const std::string& text = args.text(0);
    args.context.scan(args.call_offset, text.size());
    std::optional<std::string> content = last_boxed(text);
    *result = content ? args.context.make_string(args.call_offset, std::move(*content)) : Value::null();
  } else {
    return false;
  }
  return true;
}

}  // namespace choreo::dsl::expr
