#include "dsl/plan/dependence.h"

#include <map>
#include <string>

namespace choreo::dsl::plan {

namespace {

using expr::Node;
using expr::NodeKind;
using expr::Op;

constexpr uint64_t kDeepest = uint64_t(1) << 63;

/// Wrapping a value in a list moves its messages one level deeper.
uint64_t deeper(uint64_t mask) { return (mask << 1) | (mask & kDeepest); }
/// Taking an element moves them one level up (what was at depth 0 is gone: indexing text yields text).
uint64_t shallower(uint64_t mask) { return (mask >> 1) | (mask & kDeepest); }

Shape deeper(const Shape& s) { return {deeper(s.messages), deeper(s.generated)}; }
Shape shallower(const Shape& s) { return {shallower(s.messages), shallower(s.generated)}; }

/// Library functions that return one of the elements of their argument(s) (so a message can come out).
bool returns_element(const std::string& function) {
  return function == "majority" || function == "max" || function == "min";
}

class Analyzer {
 public:
  explicit Analyzer(const std::function<Shape(std::string_view)>& shape_of_name)
      : shape_of_name_(shape_of_name) {}

  bool reads = false;

  Shape visit(const Node* node) {
    if (node == nullptr) return {};
    switch (node->kind) {
      case NodeKind::Literal:
        return {};
      case NodeKind::Name:
        return name(node->name);
      case NodeKind::List: {
        Shape out;
        for (const auto& child : node->children) out |= visit(child.get());
        return deeper(out);
      }
      case NodeKind::Dict: {
        Shape values;
        for (size_t i = 0; i < node->children.size(); ++i) {
          const Shape s = visit(node->children[i].get());
          if (i % 2 == 0)
            read_if(s.generated != 0);  // a message as a key is looked at as text
          else
            values |= s;
        }
        return deeper(values);
      }
      case NodeKind::Attribute: {
        const Shape object = visit(node->children[0].get());
        read_if(object.generated & 1);
        return shallower(object);
      }
      case NodeKind::Index: {
        const Shape object = visit(node->children[0].get());
        const Shape index = visit(node->children[1].get());
        read_if((object.generated & 1) || index.generated != 0);
        return shallower(object);
      }
      case NodeKind::Slice: {
        const Shape object = visit(node->children[0].get());
        read_if(object.generated & 1);
        read_if(visit(node->children[1].get()).generated != 0);
        read_if(visit(node->children[2].get()).generated != 0);
        return object;
      }
      case NodeKind::Unary:
        read_if(visit(node->children[0].get()).generated != 0);
        return {};
      case NodeKind::Binary:
        return binary(*node);
      case NodeKind::And:
      case NodeKind::Or: {
        Shape left = visit(node->children[0].get());
        const Shape right = visit(node->children[1].get());
        read_if((left.generated | right.generated) & 1);  // truthiness of a message is its text
        return left |= right;
      }
      case NodeKind::Conditional: {
        Shape yes = visit(node->children[0].get());
        read_if(visit(node->children[1].get()).generated != 0);
        const Shape no = visit(node->children[2].get());
        return yes |= no;
      }
      case NodeKind::Call:
        return call(*node);
      case NodeKind::Comprehension:
        return comprehension(*node);
    }
    return {};
  }

 private:
  const std::function<Shape(std::string_view)>& shape_of_name_;
  std::vector<std::map<std::string, Shape>> locals_;  // comprehension variables, innermost last

  void read_if(bool condition) { reads = reads || condition; }

  Shape name(const std::string& name) const {
    for (auto scope = locals_.rbegin(); scope != locals_.rend(); ++scope)
      if (auto it = scope->find(name); it != scope->end()) return it->second;
    return shape_of_name_(name);
  }

  Shape binary(const Node& node) {
    Shape left = visit(node.children[0].get());
    const Shape right = visit(node.children[1].get());
    if (node.op == Op::Plus || node.op == Op::Multiply) {
      // List concatenation and repetition move messages without reading them; on text they read it.
      read_if((left.generated | right.generated) & 1);
      return left |= right;
    }
    // Arithmetic, comparisons and `in` look at the values themselves (messages compare by text).
    read_if((left.generated | right.generated) != 0);
    return {};
  }

  Shape call(const Node& node) {
    Shape arguments;
    for (const auto& child : node.children) arguments |= visit(child.get());
    if (node.name == "len") {
      read_if(arguments.generated & 1);  // the length of a list does not read its elements
      return {};
    }
    read_if(arguments.generated != 0);
    if (returns_element(node.name)) return arguments |= shallower(arguments);
    if (node.name == "sorted") return arguments;
    return {};
  }

  Shape comprehension(const Node& node) {
    locals_.emplace_back();
    for (const expr::Clause& clause : node.clauses) {
      const Shape s = visit(clause.expression.get());
      if (clause.is_for) {
        read_if(s.generated & 1);  // iterating over a message iterates over its text
        locals_.back()[clause.variable] = shallower(s);
      } else {
        read_if(s.generated != 0);
      }
    }
    const Shape element = visit(node.children[0].get());
    locals_.pop_back();
    return deeper(element);
  }
};

}  // namespace

Shape shape_of(const expr::Value& value) {
  const expr::Value::Summary summary = value.summary();
  return {summary.message_depths, summary.unknown_text_depths};
}

Dependence analyze(const expr::Expr& expr, const std::function<Shape(std::string_view name)>& shape_of_name) {
  Analyzer analyzer(shape_of_name);
  Dependence out;
  out.result = analyzer.visit(expr.root.get());
  out.reads_generated_text = analyzer.reads;
  return out;
}

}  // namespace choreo::dsl::plan
