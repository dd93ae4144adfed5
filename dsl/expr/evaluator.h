#pragma once
// Evaluates a parsed expression against a scope of named values, within a step budget and size caps so that
// no input can hang the host or exhaust its memory. Every failure is an InputError pointing into the text.

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/expr/ast.h"
#include "dsl/expr/value.h"

namespace choreo::dsl::expr {

/// Where evaluation looks up free names; the interpreter implements it over its loop variables and messages.
class Scope {
 public:
  virtual ~Scope() = default;
  /// The value bound to `name`, or nullopt when the name is not in scope.
  virtual std::optional<Value> lookup(std::string_view name) const = 0;
  /// Every name in scope, for "did you mean" suggestions (called only when a lookup fails).
  virtual std::vector<std::string> names() const = 0;
};

/// A Scope backed by a map, optionally falling back to a parent scope (for nested bindings).
class MapScope : public Scope {
 public:
  MapScope() = default;
  MapScope(std::initializer_list<std::pair<const std::string, Value>> values) : values_(values) {}
  explicit MapScope(const Scope* parent) : parent_(parent) {}
  void set(std::string name, Value value) { values_[std::move(name)] = std::move(value); }
  std::optional<Value> lookup(std::string_view name) const override;
  std::vector<std::string> names() const override;

 private:
  std::map<std::string, Value, std::less<>> values_;
  const Scope* parent_ = nullptr;
};

/// Bounds on one evaluation. Exceeding any is an InputError naming the limit.
struct EvalLimits {
  int64_t max_steps = 1'000'000;          ///< nodes evaluated, list elements built, plus work on long texts
  size_t max_list_length = 1'000'000;     ///< any list built (range, comprehension, +, *, split, ...)
  size_t max_string_bytes = 16u << 20;    ///< any string built
  size_t max_total_bytes = 256u << 20;    ///< all strings and lists built during the evaluation, summed
  uint32_t regex_match_limit = 1'000'000; ///< PCRE2 match limit per regex call (bounds backtracking)
  int64_t regex_call_steps = 1'000;       ///< steps charged for each regex call
};

/// Evaluates `expr` with free names looked up in `scope`.
Value evaluate(const Expr& expr, const Scope& scope, const EvalLimits& limits = {});

/// Evaluates a condition (`until`, `when`): the result must be a bool.
bool evaluate_condition(const Expr& expr, const Scope& scope, const EvalLimits& limits = {});

}  // namespace choreo::dsl::expr
