// libFuzzer target for the expression language: any text, parsed as a bare expression and as a template and
// evaluated against a small scope under small limits, must give a value or an InputError — never a crash,
// hang, leak or other exception. Oracles: free_names(), render_limited() and describe() never throw; an error's column lies
// within the text's line; no value is deeper or larger than the value limits. Some inputs are generated deep
// or large (tests/fuzz/fuzz_common.h, expand()): nested brackets, json() of nested lists, long operator chains.

#include <cstdint>
#include <string>
#include <string_view>

#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/template.h"
#include "common/error.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using namespace choreo::dsl::expr;

const MapScope& fuzz_scope() {
  static const MapScope scope = [] {
    MapScope s;
    s.set("agents", Value::integer(3));
    s.set("r", Value::integer(1));
    s.set("i", Value::integer(0));
    s.set("x", Value::floating(2.5));
    s.set("problem", Value::string("What is \\boxed{\\frac{1}{2}}? {\"a\": [1, 2]}"));
    s.set("votes", Value::list({Value::string("yes"), Value::string("no"), Value::string("yes")}));
    s.set("answer", Value::list({Value::list({Value::message({1, "answer: 4"}), Value::message({2, "5"})}),
                                 Value::list({Value::message({3, "\\boxed{4}"}), Value::message({4, ""})})}));
    s.set("cfg", Value::dict({{"model", Value::string("small")}, {"n", Value::integer(2)}}));
    s.set("none", Value::null());
    return s;
  }();
  return scope;
}

void check_error(const choreo::InputError& e) {
  if (e.where().file != "fuzz.yaml" || e.where().line < 3 || e.where().col < 1) __builtin_trap();
  volatile size_t sink = e.render().size();
  (void)sink;
}

void check_value(const Value& value) {
  const Value::Summary s = value.summary();
  if (s.depth > kMaxValueDepth || s.elements > kMaxValueElements) __builtin_trap();
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return choreo::fuzz::mutate(data, size, max_size, seed,
                              {{"", "[", "1", "]", ""},
                               {"len(", "[", "votes", "]", ")"},
                               {"json('", "[", "", "]", "')"},
                               {"json('", "{\"a\": ", "1", "}", "')"},
                               {"", "(", "x", ")", ""},
                               {"", "-", "1", "", ""},
                               {"", "not ", "true", "", ""},
                               {"1", " + 1", "", "", ""},
                               {"'", "ab", "", "", "' * 2"},
                               {"[", "[answer, answer], ", "", "", "]"},
                               {"{{ ", "[", "problem", "]", " }}"}});
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string expanded = choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 64 << 10);
  const std::string_view text = expanded;
  const choreo::SourceLocation where{"fuzz.yaml", 3, 5};
  EvalLimits limits;
  limits.max_steps = 100'000;
  limits.max_list_length = 100'000;
  limits.max_string_bytes = 1 << 20;
  limits.max_total_bytes = 16 << 20;
  limits.regex_match_limit = 100'000;
  try {
    Expr expr = parse_expression(text, where);
    volatile size_t names = free_names(expr).size();
    (void)names;
    Value value = evaluate(expr, fuzz_scope(), limits);
    check_value(value);
    volatile size_t rendered = render_limited(value, limits.max_string_bytes).value_or("").size() + describe(value).size();
    (void)rendered;
  } catch (const choreo::InputError& e) {
    check_error(e);
  }
  try {
    Template tmpl = parse_template(text, where);
    volatile size_t names = free_names(tmpl).size();
    (void)names;
    volatile size_t rendered = render(tmpl, fuzz_scope(), limits).size();
    (void)rendered;
  } catch (const choreo::InputError& e) {
    check_error(e);
  }
  return 0;
}
