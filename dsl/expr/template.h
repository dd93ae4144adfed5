#pragma once
// Templates for text fields: literal text with `{{ expression }}` substitutions.
//   "Solve: {{ problem }}"      -> the value of `problem`, rendered as text (see render() in value.h)
//   "{{{{"                      -> a literal "{{" (so is {{ '{{' }}); a lone "}}" is literal text
// An unclosed `{{` is an error pointing at it; errors inside `{{ }}` point into the template's own text.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"

namespace choreo::dsl::expr {

/// One piece of a template: literal text, or an expression to substitute.
struct TemplatePart {
  std::string text;           ///< literal text (when `expression` is empty)
  std::optional<Expr> expression;
};

/// A parsed text field; render() it against a scope as often as needed.
struct Template {
  std::vector<TemplatePart> parts;
  SourcePtr source;
  /// True when there is no `{{ }}` (the text is the same in every scope, so its encoding can be shared).
  bool is_constant() const;
};

/// Parses a template; `location` is where its first character sits in its file. Throws InputError.
Template parse_template(std::string_view text, const SourceLocation& location, const ParseLimits& limits = {});

/// Renders a template; all of its `{{ }}` parts share one evaluation budget, and the result is capped at
/// limits.max_string_bytes.
std::string render(const Template& tmpl, const Scope& scope, const EvalLimits& limits = {});

/// parse_template + render in one call.
std::string render_template(std::string_view text, const Scope& scope, const SourceLocation& location,
                            const EvalLimits& limits = {});

/// The free names of every `{{ }}` part, in source order.
std::vector<Name> free_names(const Template& tmpl);

}  // namespace choreo::dsl::expr
