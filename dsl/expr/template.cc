#include "dsl/expr/template.h"

#include <fmt/format.h>

#include "dsl/expr/context.h"

namespace choreo::dsl::expr {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/// The offset of the `}}` closing the `{{` whose inside starts at `begin`, or npos. Skips string literals and
/// balanced dict braces so `{{ '}}' }}` and `{{ {'a': {'b': 1}} }}` close where a reader expects.
size_t find_close(std::string_view text, size_t begin) {
  int depth = 0;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\'' || c == '"') {
      const bool raw = i > begin && (text[i - 1] == 'r' || text[i - 1] == 'R') &&
                       !(i - 1 > begin && is_name_char(text[i - 2]));
      size_t j = i + 1;
      while (j < text.size() && text[j] != c && text[j] != '\n') j += (!raw && text[j] == '\\') ? 2 : 1;
      if (j >= text.size() || text[j] != c) return std::string_view::npos;  // unterminated string
      i = j;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (depth == 0 && i + 1 < text.size() && text[i + 1] == '}') return i;
      if (depth > 0) --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

bool Template::is_constant() const {
  for (const TemplatePart& part : parts)
    if (part.expression) return false;
  return true;
}

Template parse_template(std::string_view text, const SourceLocation& location, const ParseLimits& limits) {
  auto source = std::make_shared<SourceText>(SourceText{std::string(text), location});
  source->index_lines_if_long();
  Template tmpl;
  tmpl.source = source;
  std::string literal;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find("{{", i);  // everything before it is literal text
    literal.append(text.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i));
    if (open == std::string_view::npos) break;
    i = open;
    if (text.compare(i, 4, "{{{{") == 0) {
      literal += "{{";
      i += 4;
      continue;
    }
    const size_t close = find_close(text, i + 2);
    if (close == std::string_view::npos)
      throw source->error_at(i, "'{{' is never closed",
                             "close the expression with }}; write {{{{ for a literal {{");
    if (!literal.empty()) tmpl.parts.push_back({std::move(literal), std::nullopt});
    literal.clear();
    tmpl.parts.push_back({{}, parse_expression_in(source, i + 2, close, limits)});
    i = close + 2;
  }
  if (!literal.empty()) tmpl.parts.push_back({std::move(literal), std::nullopt});
  return tmpl;
}

std::string render(const Template& tmpl, const Scope& scope, const EvalLimits& limits) {
  std::string out;
  if (tmpl.is_constant()) {
    for (const TemplatePart& part : tmpl.parts) out += part.text;
    return out;
  }
  Context context(*tmpl.source, limits);
  for (const TemplatePart& part : tmpl.parts) {
    if (!part.expression) {
      context.check_string_length(0, out.size() + part.text.size());
      out += part.text;
      continue;
    }
    const Node& root = *part.expression->root;
    Value value = evaluate_node(root, scope, context);
    const size_t room = limits.max_string_bytes - std::min(out.size(), limits.max_string_bytes);
    std::optional<std::string> text = render_limited(value, room);
    if (!text) context.check_string_length(start_offset(root), limits.max_string_bytes + 1);  // throws
    context.check_string_length(start_offset(root), out.size() + text->size());
    out += *text;
  }
  context.reserve_string(0, out.size());
  return out;
}

std::string render_template(std::string_view text, const Scope& scope, const SourceLocation& location,
                            const EvalLimits& limits) {
  return render(parse_template(text, location), scope, limits);
}

std::vector<Name> free_names(const Template& tmpl) {
  std::vector<Name> out;
  for (const TemplatePart& part : tmpl.parts) {
    if (!part.expression) continue;
    std::vector<Name> names = free_names(*part.expression);
    out.insert(out.end(), names.begin(), names.end());
  }
  return out;
}

}  // namespace choreo::dsl::expr
