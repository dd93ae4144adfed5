#pragma once
// The state of one evaluation, shared by the evaluator, the operators and the function library: the source
// text errors point into, the limits and what has been spent against them. Internal to dsl/expr.

#include <map>
#include <memory>
#include <string>

#include "dsl/expr/evaluator.h"
#include "dsl/expr/source.h"

namespace choreo {
class Regex;  // common/regex.h
}  // namespace choreo

namespace choreo::dsl::expr {

/// Budget accounting and error construction for one evaluate() call.
class Context {
 public:
  Context(const SourceText& source, const EvalLimits& limits);
  ~Context();

  const EvalLimits& limits() const { return limits_; }
  const SourceText& source() const { return source_; }

  /// Spends `steps` of the step budget; `offset` is what an error points at.
  void step(size_t offset, int64_t steps = 1);
  /// Steps left in the budget (a bound for work done before it is charged).
  int64_t remaining_steps() const { return limits_.max_steps - steps_; }
  /// Spends steps for scanning `bytes` of text (1 step per 64 bytes).
  void scan(size_t offset, size_t bytes) { step(offset, static_cast<int64_t>(bytes / 64)); }
  /// Checks that a string of `bytes` may be built, and spends it against the total.
  void reserve_string(size_t offset, size_t bytes);
  /// Checks that a list of `length` elements may be built, and spends it against the budgets.
  void reserve_list(size_t offset, size_t length);

  /// Checks a list being built may grow to `length` (its memory is charged by reserve_list when done).
  void check_list_length(size_t offset, size_t length);

  /// Checks a string being built may grow to `bytes` (its memory is charged by reserve_string when done).
  void check_string_length(size_t offset, size_t bytes) {
    if (bytes > limits_.max_string_bytes) reserve_string(offset, bytes);  // throws with the message
  }

  Value make_string(size_t offset, std::string text);
  Value make_list(size_t offset, List items);

  InputError error(size_t offset, std::string message, std::string hint = {}) const {
    return source_.error_at(offset, std::move(message), std::move(hint));
  }

  /// A compiled regex for `pattern`, cached for the rest of this evaluation.
  const Regex& regex(size_t offset, const std::string& pattern);

 private:
  const SourceText& source_;
  const EvalLimits& limits_;
  int64_t steps_ = 0;
  size_t total_bytes_ = 0;
  std::map<std::string, std::unique_ptr<Regex>, std::less<>> regexes_;
};

/// Evaluates one tree within an existing Context (templates share one budget across their `{{ }}` parts).
Value evaluate_node(const struct Node& node, const Scope& scope, Context& context);

}  // namespace choreo::dsl::expr
