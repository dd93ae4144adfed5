#include "dsl/expr/ast.h"

#include <algorithm>

namespace choreo::dsl::expr {

const char* spelling(Op op) {
  switch (op) {
    case Op::None: return "";
    case Op::Plus: return "+";
    case Op::Minus: return "-";
    case Op::Multiply: return "*";
    case Op::Divide: return "/";
    case Op::FloorDivide: return "//";
    case Op::Modulo: return "%";
    case Op::Power: return "**";
    case Op::Equal: return "==";
    case Op::NotEqual: return "!=";
    case Op::Less: return "<";
    case Op::LessEqual: return "<=";
    case Op::Greater: return ">";
    case Op::GreaterEqual: return ">=";
    case Op::In: return "in";
    case Op::NotIn: return "not in";
    case Op::Not: return "not";
  }
  return "?";
}

std::string_view Expr::text() const { return source ? std::string_view(source->text) : std::string_view(); }

namespace {

/// Walks the tree in source order; `bound` holds the comprehension variables visible at this point.
void collect(const Node* node, std::vector<std::string>& bound, const SourceText& source, std::vector<Name>& out) {
  if (!node) return;
  switch (node->kind) {
    case NodeKind::Name:
      if (std::find(bound.begin(), bound.end(), node->name) == bound.end())
        out.push_back({node->name, source.location_at(node->offset)});
      return;
    case NodeKind::Comprehension: {
      // Source order is element first, then clauses, but the element sees every clause's variable.
      // Scoping follows Python: each clause sees the variables of the clauses before it.
      const size_t outer = bound.size();
      std::vector<Name> element_names;
      for (const Clause& clause : node->clauses) {
        collect(clause.expression.get(), bound, source, element_names);
        if (clause.is_for) bound.push_back(clause.variable);
      }
      std::vector<Name> own;
      collect(node->children[0].get(), bound, source, own);
      bound.resize(outer);
      out.insert(out.end(), own.begin(), own.end());
      out.insert(out.end(), element_names.begin(), element_names.end());
      return;
    }
    default:
      for (const NodePtr& child : node->children) collect(child.get(), bound, source, out);
  }
}

}  // namespace

size_t start_offset(const Node& node) {
  size_t start = node.offset;
  for (const NodePtr& child : node.children)
    if (child) start = std::min(start, start_offset(*child));
  return start;
}

std::vector<Name> free_names(const Expr& expr) {
  std::vector<Name> out;
  std::vector<std::string> bound;
  if (expr.root) collect(expr.root.get(), bound, *expr.source, out);
  return out;
}

}  // namespace choreo::dsl::expr
