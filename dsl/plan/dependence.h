#pragma once
// What an expression needs that only a run provides. The checker evaluates an expression before the run only
// when it neither names an unknown value nor reads the text of a message whose text is unknown (a decode's
// generated text). Passing messages around (`cot[best]`, `[pro[t], con[t]]`, a comprehension over them) does
// not read their text; comparing, searching or converting them does. The analysis is conservative: when in
// doubt it says "reads".

#include <cstdint>
#include <functional>
#include <string_view>

#include "dsl/expr/ast.h"
#include "dsl/expr/value.h"

namespace choreo::dsl::plan {

/// Where messages may sit in a value: bit k set = at list/dict depth k (0 = the value itself is one; bit 63
/// stands for "63 or deeper"). `generated` is the subset whose text is unknown before the run.
struct Shape {
  uint64_t messages = 0;
  uint64_t generated = 0;

  Shape& operator|=(const Shape& other) {
    messages |= other.messages;
    generated |= other.generated;
    return *this;
  }
};

/// The shape of a known value, read from its summary (no walk): messages whose text is not known
/// (MessageRef::text_known false) are the generated ones.
Shape shape_of(const expr::Value& value);

/// What an expression does with messages.
struct Dependence {
  bool reads_generated_text = false;  ///< some operation looks at a message whose text is unknown
  Shape result;                       ///< where messages may sit in its value
};

/// Analyses `expr`; `shape_of_name` gives the shape of each free name (unknown names included).
Dependence analyze(const expr::Expr& expr, const std::function<Shape(std::string_view name)>& shape_of_name);

}  // namespace choreo::dsl::plan
