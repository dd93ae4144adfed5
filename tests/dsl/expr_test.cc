// Expression language: values, operators, precedence, comprehensions, the function library, templates and
// free names. Expected values are worked out by hand (or by Python's semantics, which the language follows).

#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/template.h"

using namespace choreo::dsl::expr;

namespace {

const choreo::SourceLocation kHere{"flow.yaml", 7, 12};

MapScope default_scope() {
  MapScope scope;
  scope.set("agents", Value::integer(3));
  scope.set("rounds", Value::integer(2));
  scope.set("problem", Value::string("2+2?"));
  scope.set("votes", Value::list({Value::string("no"), Value::string("yes"), Value::string("yes")}));
  scope.set("answer", Value::list({Value::list({Value::message({10, "a0"}), Value::message({11, "a1"}),
                                                Value::message({12, "a2"})}),
                                   Value::list({Value::message({20, "b0"}), Value::message({21, "b1"}),
                                                Value::message({22, "b2"})})}));
  scope.set("cfg", Value::dict({{"model", Value::string("small")}, {"depth", Value::integer(2)}}));
  return scope;
}

Value eval(std::string_view text) { return evaluate(parse_expression(text, kHere), default_scope()); }
/// The value as JSON, for compact comparisons.
std::string json_of(std::string_view text) { return to_json(eval(text)); }

}  // namespace

TEST_CASE("expr: literals and arithmetic follow Python's rules") {
  CHECK(json_of("1 + 2 * 3") == "7");
  CHECK(json_of("7 / 2") == "3.5");  // int / int is a float
  CHECK(json_of("6 / 3") == "2.0");
  CHECK(json_of("7 // 2") == "3");
  CHECK(json_of("-7 // 2") == "-4");  // floor, not truncation
  CHECK(json_of("-7 % 3") == "2");    // sign of the divisor
  CHECK(json_of("7 % -3") == "-2");
  CHECK(json_of("7.5 // 2") == "3.0");
  CHECK(json_of("-7.5 % 2") == "0.5");
  CHECK(json_of("2 ** 10") == "1024");
  CHECK(json_of("2 ** -1") == "0.5");
  CHECK(json_of("'ab' + \"cd\"") == "\"abcd\"");
  CHECK(json_of("[1] + [2, 3]") == "[1, 2, 3]");
  CHECK(json_of("'ab' * 3") == "\"ababab\"");
  CHECK(json_of("2 * [0]") == "[0, 0]");
  // Repeating nothing is nothing, at once, whatever the count (a fuzzer found a 2.7e9-step loop here).
  CHECK(json_of("555555555 * 5 * ''") == "\"\"");
  CHECK(json_of("[] * 9223372036854775807") == "[]");
  CHECK(json_of("'a\\tb\\n\\'\\\"\\\\'") == "\"a\\tb\\n'\\\"\\\\\"");
  CHECK(json_of("r'\\d+'") == "\"\\\\d+\"");
  // JSON's escapes too, so that a list written as JSON text is a list literal: \/ \b \f and \uXXXX (a code
  // point as UTF-8; a surrogate pair is one character). Bytes worked out from the code points by hand.
  CHECK(eval("'a\\/b\\b\\f'").as_text() == "a/b\b\f");
  CHECK(eval("'caf\\u00e9'").as_text() == "caf\xC3\xA9");
  CHECK(eval("\"\\u4E2D\\u0041\"").as_text() == "\xE4\xB8\xAD" "A");
  CHECK(eval("'\\ud83d\\ude00!'").as_text() == "\xF0\x9F\x98\x80!");
  CHECK(eval("'\\u007f\\u0080\\u07ff\\u0800\\uffff'").as_text() ==
        "\x7F" "\xC2\x80" "\xDF\xBF" "\xE0\xA0\x80" "\xEF\xBF\xBF");
  CHECK(eval("r'\\u00e9'").as_text() == "\\u00e9");  // raw strings keep it
  CHECK(json_of("['\\u00e9', \"x\\u0020y\"]") == "[\"\xC3\xA9\", \"x y\"]");
  CHECK(json_of("1.5e3") == "1500.0");
  CHECK(json_of("null") == "null");
  CHECK(json_of("{'a': 1, \"b\": [true, false]}") == "{\"a\": 1, \"b\": [true, false]}");
  CHECK(json_of("9223372036854775807") == "9223372036854775807");
}

TEST_CASE("expr: precedence table") {
  // Each row: an expression and the same expression fully parenthesised by hand.
  const std::pair<const char*, const char*> rows[] = {
      {"1 + 2 * 3", "1 + (2 * 3)"},
      {"10 - 4 - 3", "(10 - 4) - 3"},
      {"2 * 3 % 4", "(2 * 3) % 4"},
      {"-2 ** 2", "-(2 ** 2)"},
      {"2 ** 3 ** 2", "2 ** (3 ** 2)"},
      {"2 ** -1", "2 ** (-1)"},
      {"1 + 2 < 4", "(1 + 2) < 4"},
      {"not 1 == 2", "not (1 == 2)"},
      {"true or false and false", "true or (false and false)"},
      {"not true or true", "(not true) or true"},
      {"1 if false else 2 if true else 3", "1 if false else (2 if true else 3)"},
      {"1 + 1 if true else 0", "(1 + 1) if true else 0"},
      {"2 in [1, 2] and 3 not in [1]", "(2 in [1, 2]) and (3 not in [1])"},
      {"answer[1][0 + 1]", "(answer[1])[1]"},
      {"-agents + 1", "(-agents) + 1"},
      {"cfg.depth * 2", "(cfg.depth) * 2"},
  };
  for (const auto& [plain, bracketed] : rows) {
    CAPTURE(plain);
    CHECK(to_json(eval(plain)) == to_json(eval(bracketed)));
  }
  CHECK(json_of("-2 ** 2") == "-4");
  CHECK(json_of("2 ** 3 ** 2") == "512");
  CHECK(json_of("10 - 4 - 3") == "3");
  CHECK(json_of("true or false and false") == "true");
}

TEST_CASE("expr: comparisons, equality across types, membership") {
  CHECK(json_of("1 == 1.0") == "true");
  CHECK(json_of("9007199254740993 == 9007199254740992.0") == "false");  // exact int/float comparison
  CHECK(json_of("1 == '1'") == "false");                                 // different types: unequal, no error
  CHECK(json_of("answer[0][1] == 'a1'") == "true");                      // a message compares by its text
  CHECK(json_of("'abc' < 'abd'") == "true");
  CHECK(json_of("[1, 2] < [1, 3]") == "true");
  CHECK(json_of("'yes' in votes") == "true");
  CHECK(json_of("'maybe' not in votes") == "true");
  CHECK(json_of("'b' in 'abc'") == "true");
  CHECK(json_of("'a' in answer[0][0]") == "true");
  CHECK(json_of("'model' in cfg") == "true");
  CHECK(json_of("null == null") == "true");
  CHECK(json_of("float('nan') == float('nan')") == "false");
}

TEST_CASE("expr: indexing, negative indices, slices, attributes") {
  CHECK(json_of("votes[0]") == "\"no\"");
  CHECK(json_of("votes[-1]") == "\"yes\"");
  CHECK(json_of("answer[rounds-1][agents-1]") == "\"b2\"");
  CHECK(eval("answer[1][2]").as_message().id == 22);
  CHECK(json_of("votes[1:]") == "[\"yes\", \"yes\"]");
  CHECK(json_of("votes[:-1]") == "[\"no\", \"yes\"]");
  CHECK(json_of("votes[5:10]") == "[]");
  CHECK(json_of("votes[-100:1]") == "[\"no\"]");
  CHECK(json_of("'héllo'[1]") == "\"é\"");  // texts index by character, not byte
  CHECK(json_of("'héllo'[1:3]") == "\"él\"");
  CHECK(json_of("cfg.model") == "\"small\"");
  CHECK(json_of("cfg['depth']") == "2");
}

TEST_CASE("expr: comprehensions, bracketed, bare and nested") {
  CHECK(json_of("[i * i for i in range(4)]") == "[0, 1, 4, 9]");
  CHECK(json_of("[i for i in range(6) if i % 2 == 0]") == "[0, 2, 4]");
  // The bare top-level form used in parent lists evaluates to a list.
  const Value parents = evaluate(parse_expression("answer[r-1][j] for j in range(agents) if j != i", kHere), [] {
    MapScope s = default_scope();
    s.set("r", Value::integer(2));
    s.set("i", Value::integer(1));
    return s;
  }());
  REQUIRE(parents.type() == Type::List);
  REQUIRE(parents.as_list().size() == 2);
  CHECK(parents.as_list()[0].as_message().id == 20);
  CHECK(parents.as_list()[1].as_message().id == 22);
  // Two for clauses: the second sees the first's variable; conditions may follow either.
  CHECK(json_of("[[i, j] for i in range(3) for j in range(i) if i + j > 1]") == "[[2, 0], [2, 1]]");
  // A comprehension inside a comprehension's element.
  CHECK(json_of("[[j for j in range(i) if j != 0] for i in range(4) if i > 1]") == "[[1], [1, 2]]");
  // Loop variables shadow the scope, and do not leak out.
  CHECK(json_of("[agents for agents in [7, 8]] + [agents]") == "[7, 8, 3]");
  CHECK(json_of("[k for k in cfg]") == "[\"depth\", \"model\"]");
  CHECK(json_of("sum(i for i in range(5))") == "10");
  CHECK(json_of("i for i in []") == "[]");
}

TEST_CASE("expr: conditionals and boolean operators short-circuit") {
  CHECK(json_of("'many' if agents > 2 else 'few'") == "\"many\"");
  CHECK(json_of("false and 1 / 0 == 1") == "false");  // right side never evaluated
  CHECK(json_of("true or 1 / 0 == 1") == "true");
  CHECK(json_of("votes[9] if false else 0") == "0");
  CHECK(evaluate_condition(parse_expression("majority(votes) == 'yes'", kHere), default_scope()));
}

TEST_CASE("expr: function library, hand-worked cases") {
  CHECK(json_of("range(3)") == "[0, 1, 2]");
  CHECK(json_of("range(1, 4)") == "[1, 2, 3]");
  CHECK(json_of("range(10, 0, -3)") == "[10, 7, 4, 1]");
  CHECK(json_of("range(0, 10, 4)") == "[0, 4, 8]");
  CHECK(json_of("range(5, 1)") == "[]");
  CHECK(json_of("len(votes)") == "3");
  CHECK(json_of("len('héllo')") == "5");
  CHECK(json_of("len(cfg)") == "2");
  CHECK(json_of("len(answer[0][0])") == "2");
  CHECK(json_of("majority(votes)") == "\"yes\"");
  CHECK(json_of("majority(['b', 'a', 'a', 'b'])") == "\"b\"");  // tie: first seen wins
  CHECK(json_of("majority([1, 1.0, 2])") == "1");               // 1 == 1.0 count together
  CHECK(json_of("majority([])") == "null");
  CHECK(json_of("regex_match(r'^\\d+$', '123')") == "true");
  CHECK(json_of("regex_match('b', 'abc')") == "true");  // searches anywhere
  CHECK(json_of("regex_match('^b', 'abc')") == "false");
  CHECK(json_of("regex_capture(r'answer: (\\d+)', 'so answer: 42.')") == "\"42\"");
  CHECK(json_of("regex_capture(r'(a)(b)', 'xab', 2)") == "\"b\"");
  CHECK(json_of("regex_capture(r'(a)(b)', 'xab', 0)") == "\"ab\"");
  CHECK(json_of("regex_capture(r'(?<n>\\d)', 'x7', 'n')") == "\"7\"");
  CHECK(json_of("regex_capture(r'\\d', 'none')") == "null");
  CHECK(json_of("regex_capture(r'(a)|(b)', 'b')") == "null");  // group 1 did not take part
  CHECK(json_of("json('{\"x\": [1, 2.5, \"s\", null, true]}')") == "{\"x\": [1, 2.5, \"s\", null, true]}");
  CHECK(json_of("json('18446744073709551615')") == "1.8446744073709552e+19");
  CHECK(json_of("json('{\"a\": {\"b\": 3}}').a.b") == "3");
  CHECK(json_of("boxed('so \\\\boxed{\\\\frac{1}{2}} done')") == "\"\\\\frac{1}{2}\"");
  CHECK(json_of("boxed('\\\\boxed{1} then \\\\fbox{2}')") == "\"2\"");
  CHECK(json_of("boxed('\\\\boxed{unclosed')") == "null");
  CHECK(json_of("boxed('no box')") == "null");
  CHECK(json_of("join(['a', 'b', 'c'], ', ')") == "\"a, b, c\"");
  CHECK(json_of("join(range(3))") == "\"012\"");
  CHECK(json_of("strip('  x y \\n')") == "\"x y\"");
  CHECK(json_of("str(2.0) + str(3) + str(true) + str([1, 'a']) + str(null)") == "\"2.03true[1, \\\"a\\\"]\"");
  CHECK(json_of("int(' -42 ')") == "-42");
  CHECK(json_of("int(3.99)") == "3");
  CHECK(json_of("int(-3.99)") == "-3");
  CHECK(json_of("float('2.5')") == "2.5");
  CHECK(json_of("float(2)") == "2.0");
  CHECK(json_of("lower('AbC')") == "\"abc\"");
  CHECK(json_of("upper('AbC')") == "\"ABC\"");
  CHECK(json_of("min([3, 1, 2])") == "1");
  CHECK(json_of("max(3, 1.5, 7)") == "7");
  CHECK(json_of("max(['a', 'c', 'b'])") == "\"c\"");
  CHECK(json_of("sum([1, 2, 3])") == "6");
  CHECK(json_of("sum([1, 2.5])") == "3.5");
  CHECK(json_of("sum([])") == "0");
  CHECK(json_of("any([false, true])") == "true");
  CHECK(json_of("all([true, false])") == "false");
  CHECK(json_of("any([])") == "false");
  CHECK(json_of("all([])") == "true");
  CHECK(json_of("sorted([3, 1.5, 2])") == "[1.5, 2, 3]");
  CHECK(json_of("sorted(['b', 'a'])") == "[\"a\", \"b\"]");
  CHECK(json_of("index(votes, 'yes')") == "1");
  CHECK(json_of("split('a,b,,c', ',')") == "[\"a\", \"b\", \"\", \"c\"]");
  CHECK(json_of("split('  a  b\\n')") == "[\"a\", \"b\"]");
}

TEST_CASE("expr: values render as text the documented way") {
  CHECK(render(Value::floating(0.1)) == "0.1");
  CHECK(render(Value::floating(2.0)) == "2.0");
  CHECK(render(Value::floating(1e100)) == "1e+100");
  CHECK(render(Value::floating(1.0 / 3.0)) == "0.3333333333333333");
  CHECK(std::stod(render(Value::floating(1.0 / 3.0))) == 1.0 / 3.0);  // round-trips
  CHECK(render(Value::integer(-5)) == "-5");
  CHECK(render(Value::null()).empty());
  CHECK(render(Value::message({3, "hello"})) == "hello");
  CHECK(render(Value::list({Value::string("a\"b"), Value::floating(0.5)})) == "[\"a\\\"b\", 0.5]");
}

TEST_CASE("expr: free names skip comprehension variables and function names") {
  Expr e = parse_expression("answer[r-1][j] for j in range(agents) if j != i", {"f.yaml", 4, 20});
  std::vector<Name> names = free_names(e);
  REQUIRE(names.size() == 4);
  CHECK(names[0].name == "answer");
  CHECK(names[0].location.col == 20);
  CHECK(names[1].name == "r");
  CHECK(names[1].location.col == 27);
  CHECK(names[2].name == "agents");
  CHECK(names[3].name == "i");
  CHECK(names[3].location.line == 4);
  // A variable is bound only inside its own comprehension.
  std::vector<Name> outer = free_names(parse_expression("[x for x in xs] + [x]", kHere));
  REQUIRE(outer.size() == 2);
  CHECK(outer[0].name == "xs");
  CHECK(outer[1].name == "x");
}

TEST_CASE("expr: names in a long expression are located as counted by hand, lines and characters") {
  // Long texts are indexed (SourceText::index_lines_if_long) so locating every name stays linear; each name's
  // line and column must still be the ones a walk over the text finds. Multi-byte strings shift byte offsets
  // away from columns, and newlines restart the columns.
  std::string text = "[";
  for (int k = 0; k < 300; ++k) text += (k % 7 == 6 ? "\n" : "") + std::string("'\u00e9\u4e2d', answer, ");
  text += "i]";
  REQUIRE(text.size() > SourceText::kIndexFrom);
  const choreo::SourceLocation start{"f.yaml", 4, 20};
  const std::vector<Name> names = free_names(parse_expression(text, start));
  REQUIRE(names.size() == 301);
  // The expected locations, by walking the text: a name starts at a byte where "answer" or "i]" begins.
  int line = start.line, col = start.col;
  size_t n = 0;
  for (size_t b = 0; b < text.size(); ++b) {
    const std::string_view rest = std::string_view(text).substr(b);
    if (rest.starts_with("answer") || rest == "i]") {
      REQUIRE(n < names.size());
      CHECK(names[n].location.line == line);
      CHECK(names[n].location.col == col);
      ++n;
    }
    if (text[b] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(text[b]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  CHECK(n == names.size());
}

TEST_CASE("expr: templates substitute, escape and report free names") {
  MapScope scope = default_scope();
  scope.set("i", Value::integer(2));
  CHECK(render_template("Solve: {{ problem }} Put the answer in \\boxed{}.", scope, kHere) ==
        "Solve: 2+2? Put the answer in \\boxed{}.");
  CHECK(render_template("From Agent {{ i }}:\n", scope, kHere) == "From Agent 2:\n");
  CHECK(render_template("{{i}}{{ i + 0.5 }}|{{ votes }}|{{ cfg }}", scope, kHere) ==
        "22.5|[\"no\", \"yes\", \"yes\"]|{\"depth\": 2, \"model\": \"small\"}");
  CHECK(render_template("{{ answer[0][1] }}", scope, kHere) == "a1");
  CHECK(render_template("literal {{{{ x }} and }} and \\frac{1}{\\sqrt{2}}", scope, kHere) ==
        "literal {{ x }} and }} and \\frac{1}{\\sqrt{2}}");
  CHECK(render_template("{{ '{{' }} and {{ '}}' }}", scope, kHere) == "{{ and }}");
  CHECK(render_template("{{ {'a': {'b': 1}}.a.b }}", scope, kHere) == "1");
  CHECK(render_template("{{ null }}", scope, kHere).empty());
  Template t = parse_template("Hi {{ name }}, {{ [x for x in xs] }}", kHere);
  CHECK_FALSE(t.is_constant());
  std::vector<Name> names = free_names(t);
  REQUIRE(names.size() == 2);
  CHECK(names[0].name == "name");
  CHECK(names[0].location.col == kHere.col + 6);
  CHECK(names[1].name == "xs");
  CHECK(parse_template("plain text }}", kHere).is_constant());
}

TEST_CASE("expr: assign_at copies and pads the lists along the path, as fan-out names bind") {
  using namespace choreo::dsl::expr;
  const Value seven = Value::integer(7);
  const std::vector<int64_t> two{2}, zero_one{0, 1};
  CHECK(to_json(assign_at(Value::null(), two, seven)) == "[null, null, 7]");
  const Value one = Value::list({Value::integer(1)});
  // A non-list on the path becomes a list; the original value is left as it was.
  CHECK(to_json(assign_at(one, zero_one, seven)) == "[[null, 7]]");
  CHECK(to_json(one) == "[1]");
  CHECK(to_json(assign_at(one, {}, seven)) == "7");
}
