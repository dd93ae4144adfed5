#include "dsl/expr/evaluator.h"

#include <algorithm>

#include <fmt/format.h>

#include "dsl/expr/context.h"
#include "dsl/expr/functions.h"
#include "dsl/expr/operators.h"

namespace choreo::dsl::expr {

std::optional<Value> MapScope::lookup(std::string_view name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  return parent_ ? parent_->lookup(name) : std::nullopt;
}

std::vector<std::string> MapScope::names() const {
  std::vector<std::string> out = parent_ ? parent_->names() : std::vector<std::string>();
  for (const auto& entry : values_) out.push_back(entry.first);
  return out;
}

namespace {

/// Walks the tree; comprehension variables live on `locals_` (innermost last) in front of the host's scope.
class Evaluator {
 public:
  Evaluator(Context& context, const Scope& scope) : context_(context), scope_(scope) {}

  Value eval(const Node& node) {
    context_.step(node.offset);
    try {
      return eval_node(node);
    } catch (const ValueLimitError& e) {  // a value built by this node is too deep or too large
      throw context_.error(node.offset, e.message(), e.hint());
    }
  }

  /// Evaluates `node` and requires a bool; `role` names what needs it ("'and'", "'if'", "the condition").
  bool condition(const Node& node, std::string_view role) {
    Value v = eval(node);
    if (v.type() != Type::Bool)
      throw context_.error(start_offset(node), fmt::format("{} needs true or false, got {} {}", role, v.type_name(), describe(v)),
                           v.is_null()     ? "test for a missing value with x != null"
                           : v.is_number() ? "compare explicitly, e.g. n > 0"
                                           : "compare explicitly, e.g. x == 'yes' or len(xs) > 0");
    return v.as_bool();
  }

 private:
  Value eval_node(const Node& node) {
    switch (node.kind) {
      case NodeKind::Literal: return node.literal;
      case NodeKind::Name: return name(node);
      case NodeKind::List: {
        List items;
        items.reserve(node.children.size());
        for (const NodePtr& child : node.children) items.push_back(eval(*child));
        return context_.make_list(node.offset, std::move(items));
      }
      case NodeKind::Dict: return dict(node);
      case NodeKind::Attribute: return attribute(node);
      case NodeKind::Index: {
        Value object = eval(*node.children[0]);
        Value index = eval(*node.children[1]);
        return index_value(object, index, context_, start_offset(*node.children[1]));
      }
      case NodeKind::Slice: {
        Value object = eval(*node.children[0]);
        Value start = node.children[1] ? eval(*node.children[1]) : Value::null();
        Value stop = node.children[2] ? eval(*node.children[2]) : Value::null();
        return slice_value(object, start, stop, context_, node.offset);
      }
      case NodeKind::Unary: return unary(node);
      case NodeKind::Binary: {
        Value left = eval(*node.children[0]);
        Value right = eval(*node.children[1]);
        return apply_binary(node.op, left, right, context_, node.offset);
      }
      case NodeKind::And:
      case NodeKind::Or: {
        const bool is_and = node.kind == NodeKind::And;
        const bool left = condition(*node.children[0], is_and ? "'and'" : "'or'");
        if (left != is_and) return Value::boolean(left);  // short-circuit
        return Value::boolean(condition(*node.children[1], is_and ? "'and'" : "'or'"));
      }
      case NodeKind::Conditional:
        return condition(*node.children[1], "'if'") ? eval(*node.children[0]) : eval(*node.children[2]);
      case NodeKind::Call: return call(node);
      case NodeKind::Comprehension: {
        List out;
        clauses(node, 0, out);
        return context_.make_list(node.offset, std::move(out));
      }
    }
    return Value::null();
  }

  Value name(const Node& node) {
    for (auto it = locals_.rbegin(); it != locals_.rend(); ++it)
      if (it->first == node.name) return it->second;
    if (std::optional<Value> v = scope_.lookup(node.name)) return *v;
    if (find_function(node.name))
      throw context_.error(node.offset, fmt::format("'{}' is a function, not a value", node.name),
                           fmt::format("call it: {}(...)", node.name));
    std::vector<std::string> candidates = scope_.names();
    for (const auto& local : locals_) candidates.push_back(local.first);
    std::vector<std::string> values_only = candidates;  // suggest functions only if no value is close
    std::string message = with_suggestion(fmt::format("unknown name '{}'", node.name), node.name, values_only);
    if (closest_name(node.name, values_only).empty())
      message = with_suggestion(fmt::format("unknown name '{}'", node.name), node.name, function_names());
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    std::string listed;
    for (size_t i = 0; i < candidates.size() && i < 12; ++i) listed += (i ? ", " : "") + candidates[i];
    if (candidates.size() > 12) listed += ", ...";
    throw context_.error(node.offset, message,
                         candidates.empty() ? "nothing is in scope here" : "names in scope: " + listed);
  }

  Value dict(const Node& node) {
    Dict items;
    for (size_t i = 0; i + 1 < node.children.size(); i += 2) {
      Value key = eval(*node.children[i]);
      if (!key.is_text())
        throw context_.error(start_offset(*node.children[i]), fmt::format("dict keys must be strings, got {}", key.type_name()),
                             "convert with str(x)");
      items.insert_or_assign(key.as_text(), eval(*node.children[i + 1]));
    }
    context_.reserve_list(node.offset, items.size());
    return Value::dict(std::move(items));
  }

  Value attribute(const Node& node) {
    Value object = eval(*node.children[0]);
    if (object.type() != Type::Dict)
      throw context_.error(node.offset, fmt::format("'.{}' needs a dict, got {}", node.name, object.type_name()),
                           object.type() == Type::List ? "index lists with [i]" : "");
    return index_value(object, Value::string(node.name), context_, node.offset);
  }

  Value unary(const Node& node) {
    if (node.op == Op::Not) return Value::boolean(!condition(*node.children[0], "'not'"));
    Value v = eval(*node.children[0]);
    if (!v.is_number())
      throw context_.error(node.offset, fmt::format("cannot apply unary '{}' to {}", spelling(node.op), v.type_name()));
    if (node.op == Op::Plus) return v;
    if (v.type() == Type::Float) return Value::floating(-v.as_float());
    if (v.as_int() == INT64_MIN) throw context_.error(node.offset, "integer overflow in unary '-'");
    return Value::integer(-v.as_int());
  }

  Value call(const Node& node) {
    const FunctionInfo* function = find_function(node.name);
    std::vector<Value> arguments;
    std::vector<size_t> offsets;
    for (const NodePtr& child : node.children) {
      arguments.push_back(eval(*child));
      offsets.push_back(start_offset(*child));
    }
    return call_function(*function, arguments, context_, node.offset, offsets);
  }

  /// Runs clause `i` onwards of a comprehension, appending produced elements to `out`.
  void clauses(const Node& node, size_t i, List& out) {
    if (i == node.clauses.size()) {
      context_.check_list_length(node.offset, out.size() + 1);
      out.push_back(eval(*node.children[0]));
      return;
    }
    const Clause& clause = node.clauses[i];
    if (!clause.is_for) {
      if (condition(*clause.expression, "a comprehension 'if'")) clauses(node, i + 1, out);
      return;
    }
    Value iterable = eval(*clause.expression);
    if (iterable.type() == Type::Dict) {
      List keys;
      for (const auto& entry : iterable.as_dict()) keys.push_back(Value::string(entry.first));
      iterable = Value::list(std::move(keys));
    }
    if (iterable.type() != Type::List)
      throw context_.error(start_offset(*clause.expression),
                           fmt::format("'for' needs a list to loop over, got {}", iterable.type_name()),
                           iterable.is_text() ? "split the text first, e.g. split(x, '\\n')"
                           : iterable.type() == Type::Int ? "loop over range(n)"
                                                          : "");
    for (const Value& item : iterable.as_list()) {
      context_.step(clause.variable_offset);
      locals_.emplace_back(clause.variable, item);
      clauses(node, i + 1, out);
      locals_.pop_back();
    }
  }

  Context& context_;
  const Scope& scope_;
  std::vector<std::pair<std::string, Value>> locals_;
};

}  // namespace

Value evaluate_node(const Node& node, const Scope& scope, Context& context) {
  return Evaluator(context, scope).eval(node);
}

Value evaluate(const Expr& expr, const Scope& scope, const EvalLimits& limits) {
  Context context(*expr.source, limits);
  return Evaluator(context, scope).eval(*expr.root);
}

bool evaluate_condition(const Expr& expr, const Scope& scope, const EvalLimits& limits) {
  Context context(*expr.source, limits);
  return Evaluator(context, scope).condition(*expr.root, "the condition");
}

}  // namespace choreo::dsl::expr
