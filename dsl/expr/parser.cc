#include "dsl/expr/parser.h"

#include <fmt/format.h>

#include "dsl/expr/functions.h"
#include "dsl/expr/lexer.h"

namespace choreo::dsl::expr {

namespace {

class Parser {
 public:
  Parser(const SourceText& source, std::vector<Token> tokens, const ParseLimits& limits)
      : source_(source), tokens_(std::move(tokens)), limits_(limits) {}

  NodePtr parse_top() {
    if (peek().kind == TokenKind::End)
      throw source_.error_at(peek().offset, "empty expression", "write a value, e.g. true or answer[0]");
    const size_t first = peek().offset;
    NodePtr node = expression();
    if (peek().kind == TokenKind::For) node = comprehension(std::move(node), first);
    if (peek().kind != TokenKind::End) unexpected("an operator or the end of the expression");
    return node;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool accept(TokenKind kind) {
    if (peek().kind != kind) return false;
    advance();
    return true;
  }

  std::string found() const {
    const Token& t = peek();
    if (t.kind == TokenKind::Name) return fmt::format("'{}'", t.text);
    if (t.kind == TokenKind::Int || t.kind == TokenKind::Float || t.kind == TokenKind::String)
      return fmt::format("{} '{}'", describe(t.kind), std::string_view(source_.text).substr(t.offset, std::min<size_t>(t.length, 30)));
    return describe(t.kind);
  }

  [[noreturn]] void unexpected(std::string_view expected, std::string hint = {}) const {
    const Token& t = peek();
    if (hint.empty() && t.kind == TokenKind::Name) hint = "is an operator or a comma missing before it?";
    if (hint.empty() && t.kind == TokenKind::Comma)
      hint = "a list of values needs brackets: [a, b]";
    throw source_.error_at(t.offset, fmt::format("expected {}, found {}", expected, found()), std::move(hint));
  }

  /// Consumes the token closing the bracket opened at `open_offset`.
  void close(TokenKind kind, const Token& opener) {
    if (accept(kind)) return;
    if (peek().kind == TokenKind::End)
      throw source_.error_at(opener.offset, fmt::format("{} is never closed", describe(opener.kind)),
                             fmt::format("add {}", describe(kind)));
    unexpected(describe(kind) + fmt::format(" to close the {} at column {}", describe(opener.kind),
                                            source_.location_at(opener.offset).col));
  }

  std::unique_ptr<Node> make(NodeKind kind, size_t offset, std::vector<NodePtr> children = {}, Op op = Op::None) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->offset = offset;
    node->op = op;
    for (const NodePtr& child : children)
      if (child) node->height = std::max(node->height, child->height + 1);
    node->children = std::move(children);
    check_height(*node);
    return node;
  }

  void check_height(const Node& node) const {
    if (node.height > limits_.max_height)
      throw source_.error_at(node.offset, "expression is too deeply nested",
                             fmt::format("at most {} levels of operators and brackets; split it with let bindings",
                                         limits_.max_height));
  }

  /// Guards recursion through brackets and prefix operators.
  struct Nest {
    Parser& parser;
    explicit Nest(Parser& p, size_t offset) : parser(p) {
      if (++parser.nesting_ > parser.limits_.max_nesting)
        throw parser.source_.error_at(offset, "expression is too deeply nested",
                                      fmt::format("at most {} nested brackets or prefix operators",
                                                  parser.limits_.max_nesting));
    }
    ~Nest() { --parser.nesting_; }
  };

  // expression := or_expr ['if' or_expr 'else' expression]
  NodePtr expression() {
    NodePtr value = or_expr();
    if (peek().kind != TokenKind::If) return value;
    const Token& if_token = advance();
    Nest nest(*this, if_token.offset);
    NodePtr condition = or_expr();
    if (!accept(TokenKind::Else)) unexpected("'else'", "a conditional is written: x if condition else y");
    NodePtr otherwise = expression();
    std::vector<NodePtr> children;
    children.push_back(std::move(value));
    children.push_back(std::move(condition));
    children.push_back(std::move(otherwise));
    return make(NodeKind::Conditional, if_token.offset, std::move(children));
  }

  NodePtr or_expr() {
    NodePtr left = and_expr();
    while (peek().kind == TokenKind::Or) {
      const size_t at = advance().offset;
      std::vector<NodePtr> children;
      children.push_back(std::move(left));
      children.push_back(and_expr());
      left = make(NodeKind::Or, at, std::move(children));
    }
    return left;
  }

  NodePtr and_expr() {
    NodePtr left = not_expr();
    while (peek().kind == TokenKind::And) {
      const size_t at = advance().offset;
      std::vector<NodePtr> children;
      children.push_back(std::move(left));
      children.push_back(not_expr());
      left = make(NodeKind::And, at, std::move(children));
    }
    return left;
  }

  NodePtr not_expr() {
    if (peek().kind != TokenKind::Not) return comparison();
    const size_t at = advance().offset;
    Nest nest(*this, at);
    std::vector<NodePtr> children;
    children.push_back(not_expr());
    return make(NodeKind::Unary, at, std::move(children), Op::Not);
  }

  /// The comparison operator at the current token (consuming it), or Op::None.
  Op comparison_operator() {
    Op op = Op::None;
    switch (peek().kind) {
      case TokenKind::Equal: op = Op::Equal; break;
      case TokenKind::NotEqual: op = Op::NotEqual; break;
      case TokenKind::Less: op = Op::Less; break;
      case TokenKind::LessEqual: op = Op::LessEqual; break;
      case TokenKind::Greater: op = Op::Greater; break;
      case TokenKind::GreaterEqual: op = Op::GreaterEqual; break;
      case TokenKind::In: op = Op::In; break;
      case TokenKind::Not:
        if (peek(1).kind != TokenKind::In) unexpected("'in' after 'not'", "write 'x not in y', or 'not (x)'");
        advance();
        op = Op::NotIn;
        break;
      default: return Op::None;
    }
    advance();
    return op;
  }

  NodePtr comparison() {
    NodePtr left = additive();
    const size_t at = peek().offset;
    Op op = comparison_operator();
    if (op == Op::None) return left;
    std::vector<NodePtr> children;
    children.push_back(std::move(left));
    children.push_back(additive());
    NodePtr node = make(NodeKind::Binary, at, std::move(children), op);
    const size_t second = peek().offset;
    if (comparison_operator() != Op::None)
      throw source_.error_at(second, "chained comparisons are not supported",
                             "write 'a < b and b < c'");
    return node;
  }

  NodePtr additive() {
    NodePtr left = term();
    while (peek().kind == TokenKind::Plus || peek().kind == TokenKind::Minus) {
      const Token& t = advance();
      std::vector<NodePtr> children;
      children.push_back(std::move(left));
      children.push_back(term());
      left = make(NodeKind::Binary, t.offset, std::move(children), t.kind == TokenKind::Plus ? Op::Plus : Op::Minus);
    }
    return left;
  }

  NodePtr term() {
    NodePtr left = unary();
    while (true) {
      Op op = Op::None;
      switch (peek().kind) {
        case TokenKind::Star: op = Op::Multiply; break;
        case TokenKind::Slash: op = Op::Divide; break;
        case TokenKind::DoubleSlash: op = Op::FloorDivide; break;
        case TokenKind::Percent: op = Op::Modulo; break;
        default: return left;
      }
      const size_t at = advance().offset;
      std::vector<NodePtr> children;
      children.push_back(std::move(left));
      children.push_back(unary());
      left = make(NodeKind::Binary, at, std::move(children), op);
    }
  }

  NodePtr unary() {
    if (peek().kind != TokenKind::Minus && peek().kind != TokenKind::Plus) return power();
    const Token& t = advance();
    Nest nest(*this, t.offset);
    std::vector<NodePtr> children;
    children.push_back(unary());
    return make(NodeKind::Unary, t.offset, std::move(children), t.kind == TokenKind::Minus ? Op::Minus : Op::Plus);
  }

  // power := postfix ['**' unary]   (right-associative; binds tighter than a unary minus on its left)
  NodePtr power() {
    NodePtr base = postfix();
    if (peek().kind != TokenKind::Power) return base;
    const size_t at = advance().offset;
    Nest nest(*this, at);
    std::vector<NodePtr> children;
    children.push_back(std::move(base));
    children.push_back(unary());
    return make(NodeKind::Binary, at, std::move(children), Op::Power);
  }

  NodePtr postfix() {
    NodePtr node = primary();
    while (true) {
      if (peek().kind == TokenKind::Dot) {
        const size_t at = advance().offset;
        if (peek().kind != TokenKind::Name)
          unexpected("a name after '.'", peek().kind == TokenKind::Int ? "index lists with [0], not .0" : "");
        Token name = advance();
        if (peek().kind == TokenKind::LeftParen)
          throw source_.error_at(name.offset, fmt::format("there are no methods: '.{}(...)'", name.text),
                                 find_function(name.text) ? fmt::format("write {}(x, ...)", name.text)
                                                          : "call a library function instead, e.g. strip(x)");
        std::vector<NodePtr> children;
        children.push_back(std::move(node));
        auto attribute = make(NodeKind::Attribute, name.offset, std::move(children));
        attribute->name = name.text;
        node = std::move(attribute);
        (void)at;
      } else if (peek().kind == TokenKind::LeftBracket) {
        node = subscript(std::move(node));
      } else if (peek().kind == TokenKind::LeftParen) {
        throw source_.error_at(peek().offset, "only library functions can be called",
                               "call a function by its name, e.g. len(x)");
      } else {
        return node;
      }
    }
  }

  NodePtr subscript(NodePtr object) {
    const Token opener = advance();
    Nest nest(*this, opener.offset);
    NodePtr start;
    if (peek().kind != TokenKind::Colon) {
      if (peek().kind == TokenKind::RightBracket)
        throw source_.error_at(peek().offset, "empty index", "write an index, e.g. x[0] or x[-1]");
      start = expression();
      if (peek().kind != TokenKind::Colon) {
        close(TokenKind::RightBracket, opener);
        std::vector<NodePtr> children;
        children.push_back(std::move(object));
        children.push_back(std::move(start));
        return make(NodeKind::Index, opener.offset, std::move(children));
      }
    }
    advance();  // ':'
    NodePtr stop;
    if (peek().kind != TokenKind::RightBracket) stop = expression();
    if (peek().kind == TokenKind::Colon)
      throw source_.error_at(peek().offset, "slices take no step", "write x[i:j]");
    close(TokenKind::RightBracket, opener);
    std::vector<NodePtr> children;
    children.push_back(std::move(object));
    children.push_back(std::move(start));
    children.push_back(std::move(stop));
    return make(NodeKind::Slice, opener.offset, std::move(children));
  }

  NodePtr primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::Int: advance(); return literal(t.offset, Value::integer(t.int_value));
      case TokenKind::Float: advance(); return literal(t.offset, Value::floating(t.float_value));
      case TokenKind::String: advance(); return literal(t.offset, Value::string(t.text));
      case TokenKind::True: advance(); return literal(t.offset, Value::boolean(true));
      case TokenKind::False: advance(); return literal(t.offset, Value::boolean(false));
      case TokenKind::Null: advance(); return literal(t.offset, Value::null());
      case TokenKind::Name: return peek(1).kind == TokenKind::LeftParen ? call() : name();
      case TokenKind::LeftParen: return parenthesized();
      case TokenKind::LeftBracket: return list();
      case TokenKind::LeftBrace: return dict();
      case TokenKind::End:
        throw source_.error_at(t.offset, "unexpected end of expression", "a value is missing here");
      default: unexpected("a value");
    }
  }

  NodePtr literal(size_t offset, Value value) {
    auto node = make(NodeKind::Literal, offset);
    node->literal = std::move(value);
    return node;
  }

  NodePtr name() {
    const Token& t = advance();
    auto node = make(NodeKind::Name, t.offset);
    node->name = t.text;
    return node;
  }

  NodePtr call() {
    const Token name = advance();
    const Token opener = advance();  // '('
    Nest nest(*this, opener.offset);
    const FunctionInfo* function = find_function(name.text);
    if (!function) {
      std::vector<std::string> names(function_names().begin(), function_names().end());
      throw source_.error_at(name.offset, with_suggestion(fmt::format("unknown function '{}'", name.text), name.text, names),
                             "functions: " + fmt::format("{}", fmt::join(names, ", ")));
    }
    std::vector<NodePtr> args;
    while (peek().kind != TokenKind::RightParen) {
      if (peek().kind == TokenKind::End) close(TokenKind::RightParen, opener);
      const size_t first = peek().offset;
      NodePtr arg = expression();
      if (peek().kind == TokenKind::For && args.empty()) arg = comprehension(std::move(arg), first);
      args.push_back(std::move(arg));
      if (!accept(TokenKind::Comma)) break;
    }
    close(TokenKind::RightParen, opener);
    const int n = static_cast<int>(args.size());
    if (n < function->min_args || (function->max_args >= 0 && n > function->max_args))
      throw source_.error_at(name.offset,
                             fmt::format("{}() takes {}, got {}", name.text, function->arity, n),
                             fmt::format("usage: {}", function->signature));
    auto node = make(NodeKind::Call, name.offset, std::move(args));
    node->name = name.text;
    return node;
  }

  NodePtr parenthesized() {
    const Token opener = advance();
    Nest nest(*this, opener.offset);
    if (peek().kind == TokenKind::RightParen)
      throw source_.error_at(opener.offset, "empty parentheses", "there are no tuples; use a list []");
    const size_t first = peek().offset;
    NodePtr inner = expression();
    if (peek().kind == TokenKind::For) inner = comprehension(std::move(inner), first);
    if (peek().kind == TokenKind::Comma)
      throw source_.error_at(peek().offset, "there are no tuples", "use a list: [a, b]");
    close(TokenKind::RightParen, opener);
    return inner;
  }

  NodePtr list() {
    const Token opener = advance();
    Nest nest(*this, opener.offset);
    std::vector<NodePtr> items;
    while (peek().kind != TokenKind::RightBracket) {
      if (peek().kind == TokenKind::End) close(TokenKind::RightBracket, opener);
      const size_t first = peek().offset;
      items.push_back(expression());
      if (peek().kind == TokenKind::For && items.size() == 1) {
        NodePtr node = comprehension(std::move(items[0]), first);
        close(TokenKind::RightBracket, opener);
        return node;
      }
      if (!accept(TokenKind::Comma)) break;
    }
    close(TokenKind::RightBracket, opener);
    return make(NodeKind::List, opener.offset, std::move(items));
  }

  NodePtr dict() {
    const Token opener = advance();
    Nest nest(*this, opener.offset);
    std::vector<NodePtr> items;
    while (peek().kind != TokenKind::RightBrace) {
      if (peek().kind == TokenKind::End) close(TokenKind::RightBrace, opener);
      items.push_back(expression());
      if (!accept(TokenKind::Colon)) unexpected("':' after a dict key", "a dict is written {\"key\": value}");
      items.push_back(expression());
      if (!accept(TokenKind::Comma)) break;
    }
    close(TokenKind::RightBrace, opener);
    return make(NodeKind::Dict, opener.offset, std::move(items));
  }

  /// `element for x in xs [if c] [for y in ys] ...`, with the `for` as the current token.
  NodePtr comprehension(NodePtr element, size_t element_offset) {
    Nest nest(*this, peek().offset);
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::Comprehension;
    node->offset = element_offset;
    node->height = element->height + 1;
    node->children.push_back(std::move(element));
    while (peek().kind == TokenKind::For || peek().kind == TokenKind::If) {
      Clause clause;
      clause.is_for = advance().kind == TokenKind::For;
      if (clause.is_for) {
        if (peek().kind != TokenKind::Name) unexpected("a variable name after 'for'");
        const Token& variable = advance();
        clause.variable = variable.text;
        clause.variable_offset = variable.offset;
        if (peek().kind == TokenKind::Comma)
          throw source_.error_at(peek().offset, "one variable per 'for'",
                                 "write 'for i in range(len(xs))' and index xs[i]");
        if (!accept(TokenKind::In)) unexpected("'in'", "a comprehension is written [e for x in xs if c]");
      }
      clause.expression = or_expr();
      node->height = std::max(node->height, clause.expression->height + 1);
      node->clauses.push_back(std::move(clause));
    }
    node->height += static_cast<int>(node->clauses.size());  // the evaluator recurses once per clause
    check_height(*node);
    return node;
  }

  const SourceText& source_;
  std::vector<Token> tokens_;
  const ParseLimits& limits_;
  size_t pos_ = 0;
  int nesting_ = 0;
};

}  // namespace

Expr parse_expression_in(SourcePtr source, size_t begin, size_t end, const ParseLimits& limits) {
  if (end - begin > limits.max_bytes)
    throw source->error_at(begin, fmt::format("expression is too long ({} bytes)", end - begin),
                           fmt::format("at most {} bytes", limits.max_bytes));
  Parser parser(*source, tokenize(*source, begin, end), limits);
  Expr expr;
  expr.root = parser.parse_top();
  expr.source = std::move(source);
  return expr;
}

Expr parse_expression(std::string_view text, const SourceLocation& location, const ParseLimits& limits) {
  auto source = std::make_shared<SourceText>(SourceText{std::string(text), location});
  source->index_lines_if_long();
  const size_t size = source->text.size();
  return parse_expression_in(std::move(source), 0, size, limits);
}

}  // namespace choreo::dsl::expr
