#pragma once
// Splits expression text into tokens. Errors (a stray character, an unterminated string, an unknown escape,
// `{{` in a bare expression) point at the offending character.

#include <cstdint>
#include <string>
#include <vector>

#include "dsl/expr/source.h"

namespace choreo::dsl::expr {

/// The kinds of token; keywords are their own kinds so the parser never compares names.
enum class TokenKind {
  End, Int, Float, String, Name,
  True, False, Null, And, Or, Not, In, If, Else, For,
  LeftParen, RightParen, LeftBracket, RightBracket, LeftBrace, RightBrace,
  Comma, Colon, Dot,
  Plus, Minus, Star, Slash, DoubleSlash, Percent, Power,
  Equal, NotEqual, Less, LessEqual, Greater, GreaterEqual,
};

/// How a token kind reads in messages: "'+'", "a name", "the end of the expression".
std::string describe(TokenKind kind);

/// One token: its kind, where it starts in the source text, and its decoded value where it has one.
struct Token {
  TokenKind kind = TokenKind::End;
  size_t offset = 0;  ///< into SourceText::text
  size_t length = 0;
  std::string text;   ///< the name, or the decoded contents of a string literal
  int64_t int_value = 0;
  double float_value = 0;
};

/// Tokenizes `source.text[begin, end)` (a whole expression, or the inside of one `{{ }}` of a template).
/// The last token is always End, at `end`.
std::vector<Token> tokenize(const SourceText& source, size_t begin, size_t end);

}  // namespace choreo::dsl::expr
