#pragma once
// Schema-typed reading of yaml-cpp nodes: maps with duplicate- and unknown-key checks, scalars with their
// exact location and quoting style, booleans that are only `true`/`false`, numbers that are literals or
// expressions. Every mismatch is an InputError at the offending node. The workflow schema (which keys exist
// where) lives in workflow_parser.cc; this file knows only YAML and value kinds.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/workflow.h"
#include "dsl/yaml_errors.h"

namespace choreo::dsl {

/// One `key: value` pair of a YAML map, with the key's text and location (list items reuse their list's key).
struct YamlEntry {
  Text key;
  YAML::Node value;
};

/// The pairs of a YAML map, in file order, after the duplicate- and unknown-key checks.
struct YamlMap {
  std::vector<YamlEntry> items;
  SourceLocation where;
  const YamlEntry* find(std::string_view key) const {
    for (const auto& e : items)
      if (e.key.value == key) return &e;
    return nullptr;
  }
};

/// "a map", "a list", "a single value" or "nothing": how errors name what was found.
std::string yaml_kind_name(const YAML::Node& node);
/// A letter or `_` (may start a name); those or a digit (may continue one).
bool is_identifier_start(char c);
bool is_identifier_char(char c);
/// True for `[A-Za-z_][A-Za-z0-9_]*`.
bool is_identifier(std::string_view text);
/// True for a decimal integer or real literal (`3`, `-0.5`, `1e-3`).
bool is_number_literal(std::string_view text);

/// Reads nodes of one file as typed values; errors point at the node and quote its line.
class YamlReader {
 public:
  using Keys = std::vector<std::string>;
  /// Gives a hint for an unknown key in a context ("" for none); did-you-mean is tried after it.
  using UnknownKeyHint = std::function<std::string(const std::string& key, std::string_view context)>;

  explicit YamlReader(const SourceFile& file, UnknownKeyHint unknown_key_hint = {})
      : file_(file), unknown_key_hint_(std::move(unknown_key_hint)) {}

  /// Where a node's own text starts (after `&anchor` / `!tag`).
  SourceLocation node_location(const YAML::Node& n) const;
  /// A scalar's value with its style and the location of its first content character.
  Text scalar_text(const YAML::Node& n) const;

  /// A map whose keys must be in `valid` (any key if empty); `owner` locates errors about a missing value.
  YamlMap read_map(const YAML::Node& n, std::string_view what, const Keys& valid, std::string_view context,
                   const SourceLocation* owner = nullptr);
  const YamlEntry& require(const YamlMap& map, std::string_view key, std::string_view what);
  /// The items of a list, each paired with the list's key; `example` shows the right form in the hint.
  std::vector<YamlEntry> read_list(const YamlEntry& e, std::string_view example);

  Text read_text(const YamlEntry& e);
  Text read_nonempty_text(const YamlEntry& e);
  Text read_name(const YamlEntry& e);
  /// A bare expression: non-empty, and `{{` is an error with a hint.
  Text read_expression(const YamlEntry& e);
  bool read_bool(const YamlEntry& e);
  /// An integer literal at least `minimum`, or an expression.
  IntSetting read_int_setting(const YamlEntry& e, int64_t minimum);
  /// A real literal in [minimum, maximum] (or (minimum, maximum]), or an expression.
  FloatSetting read_float_setting(const YamlEntry& e, double minimum, double maximum, bool exclusive_minimum);

  std::optional<int64_t> parse_integer(const Text& t, std::string_view key);
  void check_identifier(const Text& t, std::string_view what);
  void check_expression(const Text& t, std::string_view key);
  /// Counts visited nodes so alias-expanded documents cannot make a walk exponential.
  void count_node(const SourceLocation& where);

  const SourceFile& file() const { return file_; }

 protected:
  const SourceFile& file_;

 private:
  UnknownKeyHint unknown_key_hint_;
  size_t nodes_visited_ = 0;
  size_t content_offset(const YAML::Node& n) const;
};

}  // namespace choreo::dsl
