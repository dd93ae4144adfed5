#include "dsl/expr/value.h"

#include <cassert>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>

#include <fmt/format.h>

namespace choreo::dsl::expr {

std::string_view type_name(Type type) {
  switch (type) {
    case Type::Null: return "null";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "string";
    case Type::List: return "list";
    case Type::Dict: return "dict";
    case Type::Message: return "message";
  }
  return "?";
}

Value Value::boolean(bool b) {
  Value v;
  v.data_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.data_ = i;
  return v;
}
Value Value::floating(double d) {
  Value v;
  v.data_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.data_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
namespace {

/// The summary of a list or dict holding `item`s, or a ValueLimitError when it passes a limit.
class SummaryBuilder {
 public:
  void add(const Value::Summary& item) {
    out_.depth = std::max(out_.depth, item.depth + 1);
    out_.elements += 1 + item.elements;  // no overflow: each item holds at most kMaxValueElements
    out_.message_depths |= deeper(item.message_depths);
    out_.unknown_text_depths |= deeper(item.unknown_text_depths);
    if (out_.elements > kMaxValueElements)
      throw ValueLimitError(fmt::format("a value would hold more than {} elements", kMaxValueElements),
                            "lists and dicts hold at most that many elements in all, nested ones included; make "
                            "the data smaller");
  }
  SummaryBuilder() { out_.depth = 1; }  // a list or dict is one level, even when empty
  Value::Summary done() const {
    if (out_.depth > kMaxValueDepth)
      throw ValueLimitError(fmt::format("a value would nest lists and dicts more than {} levels deep", kMaxValueDepth),
                            "values nest at most that deep; flatten the data (e.g. append to a list instead of "
                            "wrapping it in a new one each iteration)");
    return out_;
  }

 private:
  /// Wrapping moves every message one level deeper (bit 63 stands for "63 or deeper").
  static uint64_t deeper(uint64_t mask) { return (mask << 1) | (mask & (uint64_t(1) << 63)); }
  Value::Summary out_;
};

}  // namespace

Value Value::list(List items) {
  SummaryBuilder summary;
  for (const Value& item : items) summary.add(item.summary());
  Value v;
  v.data_ = std::make_shared<Composite<List>>(Composite<List>{std::move(items), summary.done()});
  return v;
}
Value Value::dict(Dict items) {
  SummaryBuilder summary;
  for (const auto& [key, item] : items) summary.add(item.summary());
  Value v;
  v.data_ = std::make_shared<Composite<Dict>>(Composite<Dict>{std::move(items), summary.done()});
  return v;
}

Value::Summary Value::summary() const {
  switch (type()) {
    case Type::List: return std::get<std::shared_ptr<const Composite<List>>>(data_)->summary;
    case Type::Dict: return std::get<std::shared_ptr<const Composite<Dict>>>(data_)->summary;
    case Type::Message: {
      Summary s;
      s.message_depths = 1;
      s.unknown_text_depths = as_message().text_known ? 0 : 1;
      return s;
    }
    default: return {};
  }
}

const void* Value::identity() const {
  if (type() == Type::List) return std::get<std::shared_ptr<const Composite<List>>>(data_).get();
  if (type() == Type::Dict) return std::get<std::shared_ptr<const Composite<Dict>>>(data_).get();
  return nullptr;
}

List Value::release_list() && {
  auto& box = std::get<std::shared_ptr<const Composite<List>>>(data_);
  List out;
  // The only owner may take the elements: the box was built non-const by make_shared, and nobody else sees it.
  if (box.use_count() == 1)
    out = std::move(const_cast<Composite<List>&>(*box).items);
  else
    out = box->items;
  data_ = std::monostate();
  return out;
}
Value Value::message(MessageRef ref) {
  Value v;
  v.data_ = std::make_shared<const MessageRef>(std::move(ref));
  return v;
}

double Value::as_number() const {
  return type() == Type::Int ? static_cast<double>(as_int()) : as_float();
}

const std::string& Value::as_text() const {
  if (type() == Type::Message) return as_message().text;
  return *std::get<std::shared_ptr<const std::string>>(data_);
}

std::partial_ordering compare_int_float(int64_t i, double d) {
  if (std::isnan(d)) return std::partial_ordering::unordered;
  if (d >= 9223372036854775808.0) return std::partial_ordering::less;  // 2^63: above every int64
  if (d < -9223372036854775808.0) return std::partial_ordering::greater;
  const double whole = std::trunc(d);  // in [-2^63, 2^63): exactly representable as int64
  const int64_t w = static_cast<int64_t>(whole);
  if (i != w) return i <=> w;
  return 0.0 <=> (d - whole);  // same whole part: the fraction decides
}

bool equal(const Value& a, const Value& b, int64_t* work, int64_t work_limit) {
  if (work && ++*work > work_limit) return false;
  if (a.is_number() && b.is_number()) {
    if (a.type() == Type::Int && b.type() == Type::Int) return a.as_int() == b.as_int();
    if (a.type() == Type::Int) return compare_int_float(a.as_int(), b.as_float()) == 0;
    if (b.type() == Type::Int) return compare_int_float(b.as_int(), a.as_float()) == 0;
    return a.as_float() == b.as_float();
  }
  if (a.is_text() && b.is_text()) {
    if (work) {
      *work += static_cast<int64_t>(std::min(a.as_text().size(), b.as_text().size()) / 64);
      if (*work > work_limit) return false;
    }
    return a.as_text() == b.as_text();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Type::Null: return true;
    case Type::Bool: return a.as_bool() == b.as_bool();
    case Type::List: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i], work, work_limit)) return false;
      return true;
    }
    case Type::Dict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j)
        if (i->first != j->first || !equal(i->second, j->second, work, work_limit)) return false;
      return true;
    }
    default: assert(false); return false;
  }
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);  // fmt's default is the shortest round-trip representation
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

static void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        else
          out += c;  // bytes >= 0x80 pass through: the text stays whatever UTF-8 it was
    }
  }
  out += '"';
}

/// Appends JSON; returns false (leaving `out` partial) once `out` passes `max_bytes`.
static bool append_json(std::string& out, const Value& v, size_t max_bytes) {
  if (out.size() > max_bytes) return false;
  if (v.is_text() && out.size() + v.as_text().size() > max_bytes) return false;
  switch (v.type()) {
    case Type::Null: out += "null"; break;
    case Type::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Type::Int: out += std::to_string(v.as_int()); break;
    case Type::Float: out += std::isfinite(v.as_float()) ? format_float(v.as_float()) : "null"; break;
    case Type::String:
    case Type::Message: append_json_string(out, v.as_text()); break;
    case Type::List: {
      out += '[';
      bool first = true;
      for (const Value& item : v.as_list()) {
        if (!first) out += ", ";
        first = false;
        if (!append_json(out, item, max_bytes)) return false;
      }
      out += ']';
      break;
    }
    case Type::Dict: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.as_dict()) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, key);
        out += ": ";
        if (!append_json(out, item, max_bytes)) return false;
      }
      out += '}';
      break;
    }
  }
  return out.size() <= max_bytes;
}

std::string to_json(const Value& value) {
  std::string out;
  append_json(out, value, SIZE_MAX);
  return out;
}

std::string render(const Value& value) {
  switch (value.type()) {
    case Type::Null: return {};
    case Type::Bool: return value.as_bool() ? "true" : "false";
    case Type::Int: return std::to_string(value.as_int());
    case Type::Float: return format_float(value.as_float());
    case Type::String:
    case Type::Message: return value.as_text();
    default: return to_json(value);
  }
}

std::optional<std::string> render_limited(const Value& value, size_t max_bytes) {
  if (value.type() == Type::List || value.type() == Type::Dict) {
    std::string out;
    if (!append_json(out, value, max_bytes)) return std::nullopt;
    return out;
  }
  if (value.is_text() && value.as_text().size() > max_bytes) return std::nullopt;
  return render(value);
}

size_t find_too_deep_json(std::string_view json, int max_depth) {
  int depth = 0;
  size_t found = std::string_view::npos;
  scan_json_outside_strings(json, 0, [&](size_t i, char c) {
    if ((c == '[' || c == '{') && ++depth > max_depth) found = i;
    if ((c == ']' || c == '}') && depth > 0) --depth;
    return found == std::string_view::npos;
  });
  return found;
}

std::string render_within(const Value& value, size_t max_bytes) {
  std::optional<std::string> text = render_limited(value, max_bytes);
  if (!text)
    throw ValueLimitError(fmt::format("the value renders to more than {} bytes of text", max_bytes),
                          "texts are limited to that size; make the data smaller");
  return std::move(*text);
}

std::string describe(const Value& value) {
  constexpr size_t kMaxChars = 40;
  std::string text;
  if (value.type() == Type::Null) {
    text = "null";
  } else if (value.type() == Type::String) {
    text = "'" + value.as_text().substr(0, 2 * kMaxChars) + "'";
  } else if (value.type() == Type::Message) {
    text = fmt::format("message #{} '{}'", value.as_message().id, value.as_text().substr(0, 2 * kMaxChars));
  } else {
    std::string json;
    text = append_json(json, value, 2 * kMaxChars) ? json : json.substr(0, 2 * kMaxChars) + "...";
  }
  if (text.size() > kMaxChars) {
    size_t cut = kMaxChars - 3;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // keep UTF-8 whole
    text = text.substr(0, cut) + "...";
  }
  for (char& c : text)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return text;
}

Value assign_at(const Value& current, std::span<const int64_t> indices, const Value& value) {
  const Assignment one{{indices.begin(), indices.end()}, value};
  return assign_all(current, {&one, 1});
}

namespace {

/// Applies `assignments` (all of whose paths are longer than `level`) below `current`, one level at a time:
/// each list on the paths is copied once (or taken over when nothing else holds it) and changed in place.
Value assign_level(Value current, std::span<const Assignment* const> assignments, size_t level) {
  // The last assignment that ends here replaces the value; only those after it change the replacement.
  size_t first = 0;
  for (size_t k = 0; k < assignments.size(); ++k)
    if (assignments[k]->indices.size() == level) {
      current = assignments[k]->value;
      first = k + 1;
    }
  if (first == assignments.size()) return current;
  List items = current.type() == Type::List ? std::move(current).release_list() : List();
  // Group the rest by their index at this level, keeping their order within each group.
  std::map<size_t, std::vector<const Assignment*>> groups;
  for (size_t k = first; k < assignments.size(); ++k)
    groups[static_cast<size_t>(assignments[k]->indices[level])].push_back(assignments[k]);
  const size_t largest = groups.rbegin()->first;
  if (items.size() <= largest) items.resize(largest + 1);
  for (auto& [i, group] : groups) items[i] = assign_level(std::move(items[i]), group, level + 1);
  return Value::list(std::move(items));
}

}  // namespace

Value assign_all(Value current, std::span<const Assignment> assignments) {
  std::vector<const Assignment*> all;
  all.reserve(assignments.size());
  for (const Assignment& a : assignments) all.push_back(&a);
  return assign_level(std::move(current), all, 0);
}

}  // namespace choreo::dsl::expr
