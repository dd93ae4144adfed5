// Located access to one JSONL line (see json_line.h).

#include "runtime/exec/json_line.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include "dsl/expr/value.h"

namespace choreo::exec {

using json = nlohmann::json;

std::vector<ByteRange> element_ranges(std::string_view line) {
  size_t first = line.find_first_not_of(" \t");
  if (first == std::string_view::npos || line[first] != '[') return {{0, line.size()}};
  std::vector<ByteRange> out;
  int depth = 0;
  size_t start = std::string_view::npos;
  dsl::expr::scan_json_outside_strings(line, first, [&](size_t k, char c) {
    if (depth == 1 && start == std::string_view::npos && !std::isspace(static_cast<unsigned char>(c)) &&
        c != ',' && c != ']')
      start = k;
    if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (--depth == 0) {
        if (start != std::string_view::npos) out.push_back({start, k});
        return false;
      }
    } else if (c == ',' && depth == 1) {
      out.push_back({start, k});
      start = std::string_view::npos;
    }
    return true;
  });
  return out;
}

namespace {

/// Builds the value of a line from nlohmann's SAX events, noting the first key given twice in one object.
/// Every event costs constant time (amortised), so a line is read in time linear in its length; nlohmann's
/// callback parser, the obvious way to see keys, rescans the enclosing list after each object it closes.
class DomBuilder {
 public:
  DomBuilder(json& root, std::string& duplicate_key) : root_(root), duplicate_key_(duplicate_key) {}

  bool null() { return add(nullptr); }
  bool boolean(bool value) { return add(value); }
  bool number_integer(json::number_integer_t value) { return add(value); }
  bool number_unsigned(json::number_unsigned_t value) { return add(value); }
  bool number_float(json::number_float_t value, const json::string_t& /*text*/) { return add(value); }
  bool string(json::string_t& value) { return add(std::move(value)); }
  bool binary(json::binary_t& value) { return add(json::binary(std::move(value))); }
  bool start_object(std::size_t /*elements*/) { return open(json::object()); }
  bool start_array(std::size_t /*elements*/) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& name) {
    // try_emplace leaves `name` alone when the key is there already; as in nlohmann's own parser, the later
    // value of a key given twice wins.
    auto [at, fresh] = open_.back()->get_ref<json::object_t&>().try_emplace(std::move(name));
    if (!fresh && duplicate_key_.empty()) duplicate_key_ = name;
    slot_ = &at->second;
    return true;
  }
  /// The parser passes its typed exception (parse_error, out_of_range): rethrow it for parse_json_line.
  template <typename Exception>
  bool parse_error(std::size_t /*byte*/, const std::string& /*token*/, const Exception& error) {
    throw error;
  }

 private:
  /// Places `value` where the parser is (the root, the end of the open list, or the key just read).
  template <typename Value>
  json* place(Value&& value) {
    if (open_.empty()) {
      root_ = json(std::forward<Value>(value));
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.emplace_back(std::forward<Value>(value));
      return &parent.back();
    }
    *slot_ = json(std::forward<Value>(value));
    return slot_;
  }
  template <typename Value>
  bool add(Value&& value) {
    place(std::forward<Value>(value));
    return true;
  }
  bool open(json&& empty) {
    open_.push_back(place(std::move(empty)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  json& root_;
  std::string& duplicate_key_;
  std::vector<json*> open_;  // the lists and objects being read, innermost last
  json* slot_ = nullptr;     // the value of the key just read
};

}  // namespace

JsonLine parse_json_line(int number, std::string text) {
  JsonLine raw{number, std::move(text), {}, {}, 0, {}};
  // nlohmann's dump, copy and comparison recurse once per level (and so would converting the value to an
  // expression value): reject over-deep lines before they are parsed.
  if (const size_t deep = dsl::expr::find_too_deep_json(raw.text); deep != std::string::npos) {
    raw.json_error = fmt::format("lists and objects nest more than {} levels deep here (choreo's limit for JSON "
                                 "and expression values)",
                                 dsl::expr::kMaxValueDepth);
    raw.json_error_byte = deep + 1;
    return raw;
  }
  try {
    DomBuilder builder(raw.value, raw.duplicate_key);
    json::sax_parse(raw.text, &builder);
  } catch (const json::parse_error& e) {
    raw.value = nullptr;  // not the part read before the error
    std::string what = e.what();
    size_t at = what.find("parse error");
    at = at == std::string::npos ? std::string::npos : what.find(": ", at);
    raw.json_error = at == std::string::npos ? what : what.substr(at + 2);
    raw.json_error_byte = e.byte;
  } catch (const json::exception& e) {
    // Well-formed JSON that nlohmann cannot hold, e.g. a number beyond double range ("number overflow
    // parsing '1e999'"): point at the quoted text when the message names it.
    raw.value = nullptr;
    const std::string what = e.what();
    const size_t at = what.find("] ");
    raw.json_error = at == std::string::npos ? what : what.substr(at + 2);
    raw.json_error_byte = 1;
    if (const size_t open = raw.json_error.find('\''); open != std::string::npos) {
      const size_t close = raw.json_error.find('\'', open + 1);
      if (close != std::string::npos) {
        const size_t found = raw.text.find(raw.json_error.substr(open + 1, close - open - 1));
        if (found != std::string::npos) raw.json_error_byte = found + 1;
      }
    }
  }
  // The parser's message quotes the text it last read, which can be a whole multi-megabyte string.
  raw.json_error = clip_text(raw.json_error, kMaxJsonErrorBytes);
  return raw;
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  return "null";
}

SourceLocation CallSite::location(size_t byte) const {
  return {file_, line_.number, byte == std::string::npos ? 0 : column_at_byte(line_.text, byte)};
}

void CallSite::fail(const std::string& message, const std::string& hint, size_t byte) const {
  if (byte == std::string::npos) byte = start();
  std::string prefix = batch_index_ >= 0 ? fmt::format("batch call #{}: ", batch_index_ + 1) : "";
  throw InputError(prefix + message, hint, location(byte), line_.text);
}

size_t CallSite::find(std::string_view needle, size_t from) const {
  size_t at = line_.text.find(needle, std::max(from, range_.begin));
  return at < range_.end ? at : std::string::npos;
}

size_t CallSite::find_key(std::string_view key, bool value) const {
  const std::string quoted = json(std::string(key)).dump();
  for (size_t at = find(quoted, range_.begin); at != std::string::npos; at = find(quoted, at + 1)) {
    size_t colon = line_.text.find_first_not_of(" \t", at + quoted.size());
    if (colon == std::string::npos || line_.text[colon] != ':') continue;  // the text inside a string value
    if (!value) return at;
    size_t v = line_.text.find_first_not_of(" \t", colon + 1);
    return v == std::string::npos ? at : v;
  }
  return start();
}

const json* Fields::get(std::string_view key) const {
  auto it = object_.find(std::string(key));
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

void Fields::wrong_type(std::string_view key, const json& value, std::string_view wanted) const {
  site_.fail(fmt::format("field '{}' must be {}, not {}", key, wanted, type_name(value)), {},
             site_.value_byte(key));
}

void Fields::bad_value(std::string_view key, const std::string& message, const std::string& hint) const {
  site_.fail(fmt::format("field '{}' {}", key, message), hint, site_.value_byte(key));
}

std::optional<std::string> Fields::string(std::string_view key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, *v, "a string");
  return v->get<std::string>();
}

std::optional<bool> Fields::boolean(std::string_view key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, *v, "true or false");
  return v->get<bool>();
}

std::optional<int> Fields::integer(std::string_view key, int64_t lo, int64_t hi) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) wrong_type(key, *v, "an integer");
  if (v->is_number_unsigned() ? v->get<uint64_t>() > uint64_t(hi) : v->get<int64_t>() > hi)
    bad_value(key, fmt::format("is {}, more than the largest allowed value {}", v->dump(), hi));
  if (!v->is_number_unsigned() && v->get<int64_t>() < lo)
    bad_value(key, fmt::format("is {}, but must not be less than {}", v->dump(), lo),
              lo == 0 ? "positions and counts are non-negative" : "");
  return int(v->get<int64_t>());
}

std::optional<double> Fields::number(std::string_view key, double lo, double hi) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, *v, "a number");
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad_value(key, fmt::format("is {}, outside [{}, {}]", v->dump(), lo, hi));
  return x;
}

std::optional<uint64_t> Fields::unsigned64(std::string_view key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) wrong_type(key, *v, "an integer");
  if (!v->is_number_unsigned()) bad_value(key, fmt::format("is {}, but must not be negative", v->dump()));
  return v->get<uint64_t>();
}

std::optional<std::vector<model::Token>> Fields::tokens(std::string_view key, int n_vocab) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(key, *v, "a list of token ids");
  std::vector<model::Token> out;
  for (const json& t : *v) {
    if (!t.is_number_integer()) wrong_type(key, t, "a list of token ids (integers)");
    const bool outside = t.is_number_unsigned() ? t.get<uint64_t>() >= uint64_t(n_vocab)
                                                : (t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab);
    if (outside)
      bad_value(key, fmt::format("holds token id {}, outside the vocabulary (0..{})", t.dump(), n_vocab - 1));
    out.push_back(model::Token(t.get<int64_t>()));
  }
  return out;
}

std::optional<std::vector<std::string>> Fields::strings(std::string_view key) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (v->is_string()) return std::vector<std::string>{v->get<std::string>()};
  if (!v->is_array()) wrong_type(key, *v, "a string or a list of strings");
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) wrong_type(key, s, "a list of strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}
}  // namespace choreo::exec
