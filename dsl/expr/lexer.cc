#include "dsl/expr/lexer.h"

#include <charconv>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "common/utf8.h"

namespace choreo::dsl::expr {

std::string describe(TokenKind kind) {
  switch (kind) {
    case TokenKind::End: return "the end of the expression";
    case TokenKind::Int: return "an integer";
    case TokenKind::Float: return "a number";
    case TokenKind::String: return "a string";
    case TokenKind::Name: return "a name";
    case TokenKind::True: return "'true'";
    case TokenKind::False: return "'false'";
    case TokenKind::Null: return "'null'";
    case TokenKind::And: return "'and'";
    case TokenKind::Or: return "'or'";
    case TokenKind::Not: return "'not'";
    case TokenKind::In: return "'in'";
    case TokenKind::If: return "'if'";
    case TokenKind::Else: return "'else'";
    case TokenKind::For: return "'for'";
    case TokenKind::LeftParen: return "'('";
    case TokenKind::RightParen: return "')'";
    case TokenKind::LeftBracket: return "'['";
    case TokenKind::RightBracket: return "']'";
    case TokenKind::LeftBrace: return "'{'";
    case TokenKind::RightBrace: return "'}'";
    case TokenKind::Comma: return "','";
    case TokenKind::Colon: return "':'";
    case TokenKind::Dot: return "'.'";
    case TokenKind::Plus: return "'+'";
    case TokenKind::Minus: return "'-'";
    case TokenKind::Star: return "'*'";
    case TokenKind::Slash: return "'/'";
    case TokenKind::DoubleSlash: return "'//'";
    case TokenKind::Percent: return "'%'";
    case TokenKind::Power: return "'**'";
    case TokenKind::Equal: return "'=='";
    case TokenKind::NotEqual: return "'!='";
    case TokenKind::Less: return "'<'";
    case TokenKind::LessEqual: return "'<='";
    case TokenKind::Greater: return "'>'";
    case TokenKind::GreaterEqual: return "'>='";
  }
  return "?";
}

namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

struct Keyword {
  std::string_view word;
  TokenKind kind;
};
constexpr Keyword kKeywords[] = {
    {"true", TokenKind::True}, {"false", TokenKind::False}, {"null", TokenKind::Null},
    {"and", TokenKind::And},   {"or", TokenKind::Or},       {"not", TokenKind::Not},
    {"in", TokenKind::In},     {"if", TokenKind::If},       {"else", TokenKind::Else},
    {"for", TokenKind::For},
};

/// Spellings from other languages that users reach for, and what to write instead.
struct Misspelling {
  std::string_view word;
  std::string_view instead;
};
constexpr Misspelling kMisspellings[] = {
    {"True", "true"}, {"False", "false"}, {"None", "null"}, {"nil", "null"}, {"elif", "... if ... else"},
};

/// The UTF-8 sequence starting at `offset`, for quoting a stray character.
std::string_view character_at(std::string_view text, size_t offset) {
  size_t length = 1;
  unsigned char lead = static_cast<unsigned char>(text[offset]);
  if (lead >= 0xF0) length = 4;
  else if (lead >= 0xE0) length = 3;
  else if (lead >= 0xC0) length = 2;
  return text.substr(offset, length);
}

class Lexer {
 public:
  Lexer(const SourceText& source, size_t begin, size_t end) : source_(source), text_(source.text), pos_(begin), end_(end) {}

  std::vector<Token> run() {
    std::vector<Token> tokens;
    while (true) {
      skip_space();
      if (pos_ >= end_) break;
      tokens.push_back(next());
    }
    Token end_token;
    end_token.offset = end_;
    tokens.push_back(end_token);
    return tokens;
  }

 private:
  char peek(size_t ahead = 0) const { return pos_ + ahead < end_ ? text_[pos_ + ahead] : '\0'; }

  void skip_space() {
    while (pos_ < end_ && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  Token make(TokenKind kind, size_t length) {
    Token t;
    t.kind = kind;
    t.offset = pos_;
    t.length = length;
    pos_ += length;
    return t;
  }

  Token next() {
    const char c = peek();
    if (is_digit(c)) return number();
    if ((c == 'r' || c == 'R') && (peek(1) == '\'' || peek(1) == '"')) return string(true);
    if (is_name_start(c)) return name();
    if (c == '\'' || c == '"') return string(false);
    switch (c) {
      case '(': return make(TokenKind::LeftParen, 1);
      case ')': return make(TokenKind::RightParen, 1);
      case '[': return make(TokenKind::LeftBracket, 1);
      case ']': return make(TokenKind::RightBracket, 1);
      case '{':
        if (peek(1) == '{')
          throw source_.error_at(pos_, "'{{' in an expression",
                                 "expressions are written bare here, without {{ }}");
        return make(TokenKind::LeftBrace, 1);
      case '}': return make(TokenKind::RightBrace, 1);
      case ',': return make(TokenKind::Comma, 1);
      case ':': return make(TokenKind::Colon, 1);
      case '.': return make(TokenKind::Dot, 1);
      case '+': return make(TokenKind::Plus, 1);
      case '-': return make(TokenKind::Minus, 1);
      case '%': return make(TokenKind::Percent, 1);
      case '*': return peek(1) == '*' ? make(TokenKind::Power, 2) : make(TokenKind::Star, 1);
      case '/': return peek(1) == '/' ? make(TokenKind::DoubleSlash, 2) : make(TokenKind::Slash, 1);
      case '<': return peek(1) == '=' ? make(TokenKind::LessEqual, 2) : make(TokenKind::Less, 1);
      case '>': return peek(1) == '=' ? make(TokenKind::GreaterEqual, 2) : make(TokenKind::Greater, 1);
      case '=':
        if (peek(1) == '=') return make(TokenKind::Equal, 2);
        throw source_.error_at(pos_, "unexpected '='", "there is no assignment; write == to compare");
      case '!':
        if (peek(1) == '=') return make(TokenKind::NotEqual, 2);
        throw source_.error_at(pos_, "unexpected '!'", "write 'not x' for negation, != to compare");
      case '&':
        throw source_.error_at(pos_, "unexpected '&'", "write 'and'");
      case '|':
        throw source_.error_at(pos_, "unexpected '|'", "write 'or'");
      default: break;
    }
    throw source_.error_at(pos_, fmt::format("unexpected character '{}'", character_at(text_, pos_)),
                           "expressions use names, numbers, 'strings', operators, [ ] ( ) { } , : and .");
  }

  Token name() {
    size_t length = 0;
    while (pos_ + length < end_ && is_name_char(text_[pos_ + length])) ++length;
    std::string_view word(text_.data() + pos_, length);
    for (const Keyword& k : kKeywords)
      if (k.word == word) return make(k.kind, length);
    for (const Misspelling& m : kMisspellings)
      if (m.word == word)
        throw source_.error_at(pos_, fmt::format("'{}' is not a keyword here", word),
                               fmt::format("write '{}'", m.instead));
    Token t = make(TokenKind::Name, length);
    t.text = std::string(word);
    return t;
  }

  Token number() {
    const size_t start = pos_;
    size_t p = pos_;
    bool is_float = false;
    while (p < end_ && is_digit(text_[p])) ++p;
    if (p < end_ && text_[p] == '.' && !(p + 1 < end_ && is_name_start(text_[p + 1]))) {
      is_float = true;
      ++p;
      while (p < end_ && is_digit(text_[p])) ++p;
    }
    if (p < end_ && (text_[p] == 'e' || text_[p] == 'E')) {
      size_t q = p + 1;
      if (q < end_ && (text_[q] == '+' || text_[q] == '-')) ++q;
      if (q < end_ && is_digit(text_[q])) {
        is_float = true;
        p = q;
        while (p < end_ && is_digit(text_[p])) ++p;
      }
    }
    if (p < end_ && is_name_char(text_[p]))
      throw source_.error_at(p, fmt::format("unexpected '{}' after a number", text_[p]),
                             "separate a number from a name with an operator");
    const char* first = text_.data() + start;
    const char* last = text_.data() + p;
    Token t = make(is_float ? TokenKind::Float : TokenKind::Int, p - start);
    if (is_float) {
      auto [ptr, ec] = std::from_chars(first, last, t.float_value);
      if (ec != std::errc() || ptr != last || !std::isfinite(t.float_value))
        throw source_.error_at(start, "number out of range", "floats go up to about 1.8e308");
    } else {
      auto [ptr, ec] = std::from_chars(first, last, t.int_value);
      if (ec != std::errc() || ptr != last)
        throw source_.error_at(start, "integer literal too large",
                               "integers are 64-bit: at most 9223372036854775807; write a float (1e19) instead");
    }
    return t;
  }

  Token string(bool raw) {
    const size_t start = pos_;
    size_t p = pos_ + (raw ? 1 : 0);
    const char quote = text_[p++];
    std::string value;
    while (true) {
      if (p >= end_ || text_[p] == '\n')
        throw source_.error_at(start, "unterminated string",
                               fmt::format("close it with {} on the same line", quote));
      char c = text_[p];
      if (c == quote) break;
      if (c == '\\' && !raw && p + 1 < end_ && text_[p + 1] == 'u') {
        p = unicode_escape(p, value);
        continue;
      }
      if (c == '\\' && !raw) {
        char e = p + 1 < end_ ? text_[p + 1] : '\0';
        switch (e) {
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          case 'r': value += '\r'; break;
          case '\\': value += '\\'; break;
          case '\'': value += '\''; break;
          case '"': value += '"'; break;
          case '/': value += '/'; break;
          case 'b': value += '\b'; break;
          case 'f': value += '\f'; break;
          default:
            throw source_.error_at(p, fmt::format("unknown escape '\\{}'", e == '\0' ? std::string_view()
                                                                                    : character_at(text_, p + 1)),
                                   "escapes are \\n \\t \\r \\\\ \\' \\\" \\/ \\b \\f \\uXXXX; write regex "
                                   "patterns as raw strings r'...' (no escapes)");
        }
        p += 2;
        continue;
      }
      if (raw && c == '\\' && p + 1 < end_ && text_[p + 1] == quote) {
        // As in Python, a raw string cannot end in a backslash before its quote: \' stays two characters.
        value += c;
        value += quote;
        p += 2;
        continue;
      }
      value += c;
      ++p;
    }
    Token t = make(TokenKind::String, p + 1 - start);
    t.text = std::move(value);
    return t;
  }

  /// The four hex digits at `p` as a number, or -1 when there are not four.
  long hex4(size_t p) const {
    if (p + 4 > end_) return -1;
    const char* first = text_.data() + p;
    uint32_t v = 0;
    const auto [last, ec] = std::from_chars(first, first + 4, v, 16);
    return ec == std::errc() && last == first + 4 ? long(v) : -1;
  }

  /// `\uXXXX` at `p` (JSON's and Python's escape): appends the code point as UTF-8 and returns the position
  /// after it. A UTF-16 surrogate pair written as two escapes (`\ud83d\ude00`) is one code point; a lone
  /// surrogate is an error, as it has no UTF-8 form.
  size_t unicode_escape(size_t p, std::string& value) const {
    const long cp = hex4(p + 2);
    if (cp < 0)
      throw source_.error_at(p, "'\\u' needs four hex digits", "write a code point as \\u00e9 (é) or \\u4e2d (中)");
    size_t next = p + 6;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
      throw source_.error_at(p, fmt::format("'\\u{:04x}' is a low surrogate with no high surrogate before it", cp),
                             "a character past U+FFFF is a pair such as \\ud83d\\ude00");
    uint32_t code = uint32_t(cp);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      const long low = next + 1 < end_ && text_[next] == '\\' && text_[next + 1] == 'u' ? hex4(next + 2) : -1;
      if (low < 0xDC00 || low > 0xDFFF)
        throw source_.error_at(p, fmt::format("'\\u{:04x}' is a high surrogate with no low surrogate after it", cp),
                               "a character past U+FFFF is a pair such as \\ud83d\\ude00");
      code = 0x10000 + ((uint32_t(cp) - 0xD800) << 10) + (uint32_t(low) - 0xDC00);
      next += 6;
    }
    append_utf8(value, code);
    return next;
  }

  const SourceText& source_;
  const std::string& text_;
  size_t pos_;
  size_t end_;
};

}  // namespace

std::vector<Token> tokenize(const SourceText& source, size_t begin, size_t end) {
  return Lexer(source, begin, end).run();
}

}  // namespace choreo::dsl::expr
