#include "dsl/yaml_reader.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <sstream>

#include "dsl/workflow_parser.h"

namespace choreo::dsl {

namespace {

using YAML::Node;
using Entry = YamlEntry;
using Entries = YamlMap;
using Keys = YamlReader::Keys;

// Alias-heavy YAML (`*a` inside `*b` inside ...) expands exponentially when walked; no real workflow comes
// close.
constexpr size_t kMaxNodesVisited = 200000;

// Scalars can be megabytes long and std::regex recurses per character, so literals are recognised by hand.

bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// Advances `i` over digits; returns how many there were.
size_t skip_digits(std::string_view s, size_t& i) {
  size_t start = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  return i - start;
}

bool is_integer_literal(std::string_view s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  return skip_digits(s, i) > 0 && i == s.size();
}

std::string kind_name(const Node& n) { return yaml_kind_name(n); }

/// Counts a document's alias references (`*name`); the loaded nodes no longer tell an alias from a copy.
class AliasCounter : public YAML::EventHandler {
 public:
  size_t n_aliases = 0;
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { ++n_aliases; }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
  }
  void OnMapEnd() override {}
};

/// True when `text` (a document yaml-cpp has loaded once already) refers to an anchor.
bool has_aliases(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  AliasCounter counter;
  try {
    while (parser.HandleNextDocument(counter)) {
    }
  } catch (const YAML::Exception&) {  // a later document's error: the workflow reader reports it elsewhere
  }
  return counter.n_aliases > 0;
}

}  // namespace

std::string yaml_kind_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "a single value";
    default:
      return "nothing";
  }
}

bool is_identifier_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }

bool is_identifier_char(char c) { return is_identifier_start(c) || is_digit(c); }

bool is_identifier(std::string_view text) {
  if (text.empty() || !is_identifier_start(text[0])) return false;
  return std::all_of(text.begin(), text.end(), is_identifier_char);
}

bool is_number_literal(std::string_view s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  size_t digits = skip_digits(s, i);
  if (i < s.size() && s[i] == '.') {
    ++i;
    digits += skip_digits(s, i);
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (skip_digits(s, i) == 0) return false;
  }
  return i == s.size();
}

void YamlReader::count_node(const SourceLocation& where) {
  if (++nodes_visited_ <= kMaxNodesVisited) return;
  // Reached only once per file, so the second parse it takes to tell the two causes apart costs nothing.
  if (has_aliases(file_.text()))
    throw file_.error(
        where,
        fmt::format("workflow is too large after expanding YAML aliases: more than {} keys, values "
                    "and list items",
                    kMaxNodesVisited),
        "use fewer nested `*alias` references");
  throw file_.error(where,
                    fmt::format("workflow has more than {} keys, values and list items", kMaxNodesVisited),
                    "a workflow is a page or two: write a long list as a comprehension (\"x[i] for i in "
                    "range(n)\"), and keep data in --inputs or eval --data files");
}

/// Byte offset where a node's own text starts (after any `&anchor` and `!tag`), or npos if unknown.
size_t YamlReader::content_offset(const Node& n) const {
  const YAML::Mark m = n.Mark();
  if (m.is_null() || m.pos < 0) return std::string::npos;
  const std::string& s = file_.text();
  size_t i = static_cast<size_t>(m.pos);
  while (i < s.size() && (s[i] == '&' || s[i] == '!')) {
    while (i < s.size() && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') ++i;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  return std::min(i, s.size());
}

SourceLocation YamlReader::node_location(const Node& n) const {
  size_t i = content_offset(n);
  if (i == std::string::npos) return SourceLocation{file_.name(), 1, 1};
  return file_.at_offset(i);
}

/// A scalar's value with its style and the location of its first content character.
Text YamlReader::scalar_text(const Node& n) const {
  Text t{n.Scalar(), node_location(n), ScalarStyle::Plain};
  size_t i = content_offset(n);
  const std::string& s = file_.text();
  if (i == std::string::npos || i >= s.size()) return t;
  char c = s[i];
  if (c == '"' || c == '\'') {
    t.style = c == '"' ? ScalarStyle::DoubleQuoted : ScalarStyle::SingleQuoted;
    t.where = file_.at_offset(i + 1);
  } else if (c == '|' || c == '>') {
    t.style = c == '|' ? ScalarStyle::Literal : ScalarStyle::Folded;
    // The first non-blank line after the `|` header holds the first content character.
    size_t line = s.find('\n', i);
    while (line != std::string::npos) {
      size_t first = s.find_first_not_of(" \t\r", line + 1);
      if (first == std::string::npos) break;
      if (s[first] != '\n') {
        t.where = file_.at_offset(first);
        break;
      }
      line = first;
    }
  }
  return t;
}

Entries YamlReader::read_map(const Node& n, std::string_view what, const Keys& valid,
                             std::string_view context, const SourceLocation* owner) {
  if (!n.IsMap()) {
    SourceLocation where = n.IsNull() && owner ? *owner : node_location(n);
    throw file_.error(where,
                      fmt::format("`{}` must be a map (key: value entries), found {}", what, kind_name(n)),
                      n.IsSequence() ? "remove the `- ` list markers" : "");
  }
  Entries out;
  out.where = node_location(n);
  for (auto it = n.begin(); it != n.end(); ++it) {
    count_node(out.where);
    if (!it->first.IsScalar()) {
      throw file_.error(node_location(it->first), fmt::format("keys of `{}` must be plain names", what));
    }
    Text key = scalar_text(it->first);
    if (const Entry* first = out.find(key.value)) {
      throw file_.error(key.where, fmt::format("duplicate key `{}` in `{}`", key.value, what),
                        fmt::format("it was already given at line {}", first->key.where.line));
    }
    if (!valid.empty() && std::find(valid.begin(), valid.end(), key.value) == valid.end()) {
      std::string hint = unknown_key_hint_ ? unknown_key_hint_(key.value, context) : std::string();
      if (hint.empty()) hint = did_you_mean(key.value, valid);
      if (hint.empty()) hint = fmt::format("valid keys here: {}", fmt::join(valid, ", "));
      throw file_.error(key.where, fmt::format("unknown key `{}` in {}", key.value, context), hint);
    }
    out.items.push_back(Entry{std::move(key), it->second});
  }
  return out;
}

const Entry& YamlReader::require(const Entries& map, std::string_view key, std::string_view what) {
  if (const Entry* e = map.find(key)) return *e;
  throw file_.error(map.where, fmt::format("`{}` is missing `{}:`", what, key),
                    fmt::format("add a `{}:` entry", key));
}

Text YamlReader::read_text(const Entry& e) {
  count_node(e.key.where);
  if (e.value.IsNull()) {
    throw file_.error(e.key.where, fmt::format("`{}` has no value", e.key.value),
                      "write the value after the colon (use \"\" for empty text)");
  }
  if (!e.value.IsScalar()) {
    throw file_.error(
        node_location(e.value),
        fmt::format("`{}` must be a single value (text), found {}", e.key.value, kind_name(e.value)),
        e.value.IsMap() ? "text containing `: ` or starting with `{` must be quoted or written as a "
                          "`|` block"
                        : "");
  }
  return scalar_text(e.value);
}

Text YamlReader::read_nonempty_text(const Entry& e) {
  Text t = read_text(e);
  if (t.value.empty()) throw file_.error(t.where, fmt::format("`{}` is empty", e.key.value));
  return t;
}

Text YamlReader::read_name(const Entry& e) {
  Text t = read_text(e);
  check_identifier(t, e.key.value);
  return t;
}

void YamlReader::check_identifier(const Text& t, std::string_view what) {
  if (!is_identifier(t.value)) {
    throw file_.error(t.where, fmt::format("`{}` is not a valid name for {}", t.value, what),
                      "names start with a letter or `_` and contain letters, digits and `_`");
  }
}

/// An expression: non-empty and without `{{` (expression keys take bare expressions, not templates).
Text YamlReader::read_expression(const Entry& e) {
  Text t = read_nonempty_text(e);
  check_expression(t, e.key.value);
  return t;
}

void YamlReader::check_expression(const Text& t, std::string_view key) {
  size_t brace = t.value.find("{{");
  if (brace != std::string::npos) {
    throw file_.error(
        locate(t, brace), fmt::format("`{{{{` in `{}`, which takes an expression", key),
        fmt::format("`{}` is already an expression: write the expression without `{{{{ }}}}`", key));
  }
}

bool YamlReader::read_bool(const Entry& e) {
  Text t = read_text(e);
  if (t.value == "true") return true;
  if (t.value == "false") return false;
  std::string lower = t.value;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::array<std::string_view, 8> yaml11 = {"yes", "no", "on", "off", "y", "n", "true", "false"};
  if (std::find(yaml11.begin(), yaml11.end(), lower) != yaml11.end()) {
    throw file_.error(t.where, fmt::format("`{}` is not a boolean here", t.value),
                      "booleans are exactly `true` or `false` (YAML 1.1's yes/no/on/off are not accepted)");
  }
  throw file_.error(t.where, fmt::format("`{}` must be `true` or `false`, found `{}`", e.key.value, t.value));
}

std::optional<int64_t> YamlReader::parse_integer(const Text& t, std::string_view key) {
  if (!is_integer_literal(t.value)) return std::nullopt;
  errno = 0;
  long long v = std::strtoll(t.value.c_str(), nullptr, 10);
  if (errno == ERANGE) throw file_.error(t.where, fmt::format("`{}` is out of range for `{}`", t.value, key));
  return v;
}

/// An integer literal (checked against `minimum`) or an expression.
IntSetting YamlReader::read_int_setting(const Entry& e, int64_t minimum) {
  Text t = read_nonempty_text(e);
  IntSetting out{t, t.where};
  if (auto v = parse_integer(t, e.key.value)) {
    if (*v < minimum) {
      throw file_.error(t.where, fmt::format("`{}` must be at least {}, found {}", e.key.value, minimum, *v),
                        e.key.value == "new_offset" || e.key.value == "at"
                            ? "offsets are token positions, counted from 0 (the BOS token)"
                            : "");
    }
    out.value = *v;
  } else if (is_number_literal(t.value)) {
    throw file_.error(t.where, fmt::format("`{}` must be a whole number, found `{}`", e.key.value, t.value));
  } else {
    check_expression(t, e.key.value);
  }
  return out;
}

/// A real literal within [minimum, maximum] or an expression.
FloatSetting YamlReader::read_float_setting(const Entry& e, double minimum, double maximum,
                                            bool exclusive_minimum) {
  Text t = read_nonempty_text(e);
  FloatSetting out{t, t.where};
  if (is_number_literal(t.value)) {
    double v = std::strtod(t.value.c_str(), nullptr);
    bool below = exclusive_minimum ? v <= minimum : v < minimum;
    if (!std::isfinite(v) || below || v > maximum) {
      throw file_.error(t.where, fmt::format("`{}` must be in {}{}, {}], found {}", e.key.value,
                                             exclusive_minimum ? "(" : "[", minimum, maximum, t.value));
    }
    out.value = v;
  } else {
    check_expression(t, e.key.value);
  }
  return out;
}

std::vector<Entry> YamlReader::read_list(const Entry& e, std::string_view example) {
  if (!e.value.IsSequence()) {
    SourceLocation where = e.value.IsNull() ? e.key.where : node_location(e.value);
    throw file_.error(where, fmt::format("`{}` must be a list, found {}", e.key.value, kind_name(e.value)),
                      fmt::format("write it as `{}: {}`", e.key.value, example));
  }
  std::vector<Entry> out;
  for (const Node& item : e.value) {
    count_node(e.key.where);
    // Items have no key of their own; errors about them name the list's key.
    out.push_back(Entry{e.key, item});
  }
  return out;
}

}  // namespace choreo::dsl
