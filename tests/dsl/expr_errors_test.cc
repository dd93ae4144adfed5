// Expression errors: each malformed or failing expression gives an InputError at the exact offending
// character (file column = start column + offset), quoting the line, with the documented message and hint.
// Also the resource limits, and boxed() checked against the MATH-500 gold answers.

#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "dsl/expr/evaluator.h"
#include "dsl/expr/functions.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/template.h"
#include "tests/test_paths.h"

using namespace choreo::dsl::expr;

namespace {

// The expression's first character is at column 10 of line 5 of flow.yaml.
const choreo::SourceLocation kStart{"flow.yaml", 5, 10};

MapScope scope() {
  MapScope s;
  s.set("answer", Value::list({Value::string("x"), Value::string("y")}));
  s.set("agents", Value::integer(3));
  s.set("votes", Value::list({Value::string("yes")}));
  s.set("cfg", Value::dict({{"model", Value::string("m")}}));
  s.set("text", Value::string("abc"));
  return s;
}

/// Parses and evaluates `text`, returning the InputError it must raise.
choreo::InputError error_of(std::string_view text, const EvalLimits& limits = {}) {
  try {
    evaluate(parse_expression(text, kStart), scope(), limits);
  } catch (const choreo::InputError& e) {
    return e;
  }
  FAIL("no error for: ", text);
  return choreo::InputError("unreachable");
}

struct Case {
  const char* text;
  size_t offset;          ///< of the offending character in `text`
  const char* message;    ///< a substring of the message
  const char* hint = "";  ///< a substring of the hint
};

}  // namespace

TEST_CASE("expr errors: point at the offending character with a message and a hint") {
  const Case cases[] = {
      {"ansewr[0]", 0, "unknown name 'ansewr' — did you mean 'answer'?", "names in scope"},
      {"agentz + 1", 0, "did you mean 'agents'?"},
      {"lenn(votes)", 0, "unknown function 'lenn' — did you mean 'len'?"},
      {"answer[5]", 7, "index 5 is out of range for a list of length 2", "0..1"},
      {"answer[-3]", 7, "index -3 is out of range"},
      {"1 + 'a'", 2, "cannot apply '+' to int and string"},
      {"'n: ' + 3", 6, "cannot apply '+' to string and int", "str(x)"},
      {"agents / 0", 7, "division by zero"},
      {"agents % 0", 7, "modulo by zero"},
      {"9223372036854775807 + 1", 20, "integer overflow in '+'"},
      {"2 ** 64", 2, "integer overflow in '**'"},
      {"0 ** -1", 2, "zero to a negative power"},  // docs: a float result that is inf from finite operands
      {"0.0 ** -1", 4, "zero to a negative power"},
      {"9223372036854775808", 0, "integer literal too large"},
      {"{{ answer }}", 0, "'{{' in an expression", "expressions are written bare here, without {{ }}"},
      {"agents = 3", 7, "unexpected '='", "=="},
      {"(agents + 1", 0, "'(' is never closed", "')'"},
      {"answer[0", 6, "'[' is never closed"},
      {"votes[0] ==", 11, "unexpected end of expression"},
      {"'abc", 0, "unterminated string"},
      {"'a\\d'", 2, "unknown escape '\\d'", "raw strings"},
      {"'ab\\u00g1'", 3, "'\\u' needs four hex digits", "\\u00e9"},
      {"'\\u12'", 1, "'\\u' needs four hex digits"},
      {"'x\\ude00'", 2, "'\\ude00' is a low surrogate with no high surrogate before it", "\\ud83d\\ude00"},
      {"'\\ud83dx'", 1, "'\\ud83d' is a high surrogate with no low surrogate after it", "pair"},
      {"'\\ud83d\\u0041'", 1, "'\\ud83d' is a high surrogate with no low surrogate after it"},
      {"1 < 2 < 3", 6, "chained comparisons are not supported", "and"},
      {"len(votes, 1)", 0, "len() takes 1 argument, got 2", "usage"},
      {"True", 0, "'True' is not a keyword here", "true"},
      {"agents and true", 0, "'and' needs true or false, got int", "compare explicitly"},
      {"[x for x in agents]", 12, "'for' needs a list to loop over, got int", "range(n)"},
      {"cfg.modle", 4, "no key 'modle' in the dict — did you mean 'model'?", "keys: model"},
      {"votes.x", 6, "'.x' needs a dict, got list", "[i]"},
      {"strip(agents)", 6, "strip() argument 1 must be a string, got int"},
      {"regex_match('(', text)", 12, "bad regex"},
      {"json('{bad')", 5, "json() cannot parse its input"},
      {"answer.strip()", 7, "there are no methods", "strip(x, ...)"},
      {"len", 0, "'len' is a function, not a value"},
      {"answer[0] answer[1]", 10, "expected an operator or the end of the expression, found 'answer'"},
      {"", 0, "empty expression"},
      {"votes @ 1", 6, "unexpected character '@'"},
      {"min([])", 4, "min() of an empty list"},
      {"index(votes, 'no')", 13, "'no' is not in the list"},
      {"agents < 'a'", 7, "cannot compare int and string"},
      {"int('x1')", 4, "int() cannot read 'x1' as an integer"},
      {"range(1, 5, 0)", 12, "step must not be zero"},
      {"null[0]", 5, "cannot index null", "!= null"},
  };
  for (const Case& c : cases) {
    const std::string text = c.text;
    CAPTURE(text);
    choreo::InputError e = error_of(c.text);
    const std::string message = e.message();
    CAPTURE(message);
    CHECK(message.find(c.message) != std::string::npos);
    CHECK(e.hint().find(c.hint) != std::string::npos);
    CHECK(e.where().file == "flow.yaml");
    CHECK(e.where().line == 5);
    CHECK(e.where().col == kStart.col + static_cast<int>(c.offset));
    // The quoted line, indented to the start column, has the expression under the caret.
    CHECK(e.quoted_line() == std::string(kStart.col - 1, ' ') + c.text);
  }
}

TEST_CASE("expr errors: multi-line expressions point at the right line and column") {
  try {
    parse_expression("[a for a in votes\n   if a ==]", kStart);
    FAIL("expected an error");
  } catch (const choreo::InputError& e) {
    CHECK(e.where().line == 6);
    CHECK(e.where().col == 11);  // the ']' on the second line, 1-based within that line
    CHECK(e.quoted_line() == "   if a ==]");
    CHECK(e.render().find("flow.yaml:6:11") != std::string::npos);
  }
}

TEST_CASE("expr errors: errors inside a template point into the template text") {
  try {
    render_template("Line one\nAgent {{ agentz }} speaks", scope(), kStart);
    FAIL("expected an error");
  } catch (const choreo::InputError& e) {
    CHECK(e.message().find("did you mean 'agents'") != std::string::npos);
    CHECK(e.where().line == 6);
    CHECK(e.where().col == 10);
    CHECK(e.quoted_line() == "Agent {{ agentz }} speaks");
  }
  try {
    parse_template("ok {{ x }} then {{ unclosed", kStart);
    FAIL("expected an error");
  } catch (const choreo::InputError& e) {
    CHECK(e.message() == "'{{' is never closed");
    CHECK(e.where().col == kStart.col + 16);
    CHECK(e.hint().find("{{{{") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_template("{{ }}", kStart), choreo::InputError);
}

TEST_CASE("expr limits: huge ranges, long loops, big strings and deep nesting are errors, not hangs") {
  CHECK(error_of("range(10**12)").message().find("too long") != std::string::npos);
  CHECK(error_of("len(range(-9223372036854775807, 9223372036854775807))").message().find("too long") !=
        std::string::npos);
  // 1000 x 1000 x 10 elements is within the list cap per list but over the step budget.
  CHECK(error_of("len([i for i in range(1000) for j in range(1000) for k in range(10)])").message().find("steps") !=
        std::string::npos);
  CHECK(error_of("'x' * 100000000").message().find("too long") != std::string::npos);
  CHECK(error_of("len(['x' * 10000000] * 2 + ['y' * 10000000] * 100)", EvalLimits{.max_total_bytes = 1 << 24})
            .message()
            .find("bytes") != std::string::npos);
  EvalLimits small;
  small.max_steps = 1000;
  CHECK(error_of("sum([i for i in range(2000)])", small).message().find("1000 steps") != std::string::npos);
  // Catastrophic backtracking stops at the match limit.
  CHECK(error_of("regex_match(r'(a+)+$', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab')")
            .message()
            .find("match limit") != std::string::npos);
  // Deep nesting is a parse error with a location, not a stack overflow.
  const std::string deep = std::string(100000, '(') + "1" + std::string(100000, ')');
  choreo::InputError e = error_of(deep);
  CHECK(e.message() == "expression is too deeply nested");
  CHECK(e.where().col == kStart.col + 64);  // the first bracket past the limit
  CHECK(error_of(std::string(100000, '-') + "1").message() == "expression is too deeply nested");
  std::string chain = "1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  CHECK(error_of(chain).message() == "expression is too deeply nested");
  std::string json_deep = "json('" + std::string(1000, '[') + std::string(1000, ']') + "')";
  CHECK(error_of(json_deep).message().find(fmt::format("more than {} levels deep", choreo::dsl::expr::kMaxValueDepth)) !=
        std::string::npos);
  // A value built past the nesting or size limit (json() may give the deepest allowed value) is an error at
  // the expression that builds it.
  const std::string deepest = "json('" + std::string(kMaxValueDepth, '[') + std::string(kMaxValueDepth, ']') + "')";
  CHECK(evaluate(parse_expression(deepest, kStart), scope()).depth() == kMaxValueDepth);
  e = error_of("len([" + deepest + "])");
  CHECK(e.message().find(fmt::format("more than {} levels deep", kMaxValueDepth)) != std::string::npos);
  CHECK(e.where().col == kStart.col + 4);
  e = error_of("[range(999)] * 1001");
  CHECK(e.message().find(fmt::format("more than {} elements", kMaxValueElements)) != std::string::npos);
  CHECK(e.where().col == kStart.col + 13);
  CHECK(evaluate(parse_expression("len([range(999)] * 1000)", kStart), scope()).as_int() == 1000);
  // Within limits, the same shapes work.
  CHECK(evaluate(parse_expression(std::string(30, '(') + "1" + std::string(30, ')'), kStart), scope()).as_int() == 1);
}

TEST_CASE("boxed(): equals the gold answer on MATH-500 rows whose solution has exactly one box") {
  std::ifstream in(choreo::testing::shared_file("data/math500_test.jsonl"));
  REQUIRE(in);
  std::string line;
  int rows = 0, single_box = 0, agree = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++rows;
    const nlohmann::json row = nlohmann::json::parse(line);
    const std::string solution = row.at("solution").get<std::string>();
    int boxes = 0;
    for (size_t at = solution.find("\\boxed"); at != std::string::npos; at = solution.find("\\boxed", at + 1)) ++boxes;
    for (size_t at = solution.find("\\fbox"); at != std::string::npos; at = solution.find("\\fbox", at + 1)) ++boxes;
    if (boxes != 1) continue;
    ++single_box;
    // Through the expression language, as a workflow would call it.
    MapScope s;
    s.set("solution", Value::string(solution));
    const Value boxed = evaluate(parse_expression("boxed(solution)", kStart), s);
    CAPTURE(solution);
    REQUIRE(boxed.type() == Type::String);
    if (boxed.as_text() == row.at("answer").get<std::string>()) ++agree;
    CHECK(boxed.as_text() == row.at("answer").get<std::string>());
  }
  MESSAGE("MATH-500: ", rows, " rows, ", single_box, " with exactly one box, ", agree, " where boxed() == answer");
  CHECK(rows == 500);
  CHECK(single_box > 400);
}
