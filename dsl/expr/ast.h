#pragma once
// The syntax tree of an expression. Each node remembers the offset of the character an error about it should
// point at (an operator, a name, an opening bracket), in the shared SourceText the Expr owns.

#include <memory>
#include <string>
#include <vector>

#include "dsl/expr/source.h"
#include "dsl/expr/value.h"

namespace choreo::dsl::expr {

/// What a Node is; the comment says what its `children` hold.
enum class NodeKind {
  Literal,        ///< none; `literal` holds the value
  Name,           ///< none; `name` holds the name
  List,           ///< the elements
  Dict,           ///< key, value, key, value, ...
  Attribute,      ///< [object]; `name` is the attribute
  Index,          ///< [object, index]
  Slice,          ///< [object, start or null, stop or null]
  Unary,          ///< [operand]; `op` is Not or Minus/Plus
  Binary,         ///< [left, right]; `op` is an arithmetic or comparison operator, In or NotIn
  And,            ///< [left, right] (short-circuit)
  Or,             ///< [left, right] (short-circuit)
  Conditional,    ///< [value if true, condition, value if false]
  Call,           ///< the arguments; `name` is the library function
  Comprehension,  ///< [element]; `clauses` hold the for/if clauses in order
};

/// Operators of Unary and Binary nodes.
enum class Op {
  None, Plus, Minus, Multiply, Divide, FloorDivide, Modulo, Power,
  Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual, In, NotIn, Not,
};

/// How an operator is written: "+", "not in", ...
const char* spelling(Op op);

struct Node;
using NodePtr = std::unique_ptr<const Node>;

/// One `for name in iterable` or `if condition` clause of a comprehension.
struct Clause {
  bool is_for = true;
  std::string variable;        ///< for clauses
  size_t variable_offset = 0;  ///< for clauses
  NodePtr expression;          ///< the iterable, or the condition
};

/// One node of the syntax tree.
struct Node {
  NodeKind kind = NodeKind::Literal;
  size_t offset = 0;  ///< the character errors about this node point at
  int height = 1;     ///< 1 + the largest child height (bounded by the parser, so recursion is bounded)
  Op op = Op::None;
  std::string name;
  Value literal;
  std::vector<NodePtr> children;  ///< may hold nullptr for absent slice bounds
  std::vector<Clause> clauses;
};

/// A parsed expression: the tree plus the text its offsets point into. Cheap to copy (shared, immutable).
struct Expr {
  std::shared_ptr<const Node> root;
  SourcePtr source;
  /// The source text of the expression (for messages and debugging).
  std::string_view text() const;
};

/// The offset of the first character of the node's text (its leftmost token).
size_t start_offset(const Node& node);

/// A name an expression reads from its scope, with where it is read.
struct Name {
  std::string name;
  SourceLocation location;
};

/// Every free name the expression reads from its scope, in source order, once per occurrence. Names bound by
/// comprehension `for` clauses and library function names (in call position) are not free.
std::vector<Name> free_names(const Expr& expr);

}  // namespace choreo::dsl::expr
