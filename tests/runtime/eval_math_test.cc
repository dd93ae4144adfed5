// MATH answer rules (runtime/eval/math_answer.h): each case is worked by hand from the rules of
// Hendrycks et al.'s math_equivalence.py, including the ones where the official rules say "not equal"
// although a mathematician would say equal.

#include <doctest/doctest.h>

#include "runtime/eval/math_answer.h"
#include "runtime/eval/metric.h"

namespace choreo::eval {
namespace {

bool equiv(const char* a, const char* b) { return is_equiv(std::string(a), std::string(b)); }

TEST_CASE("eval math: the last \\boxed{} is extracted with its braces matched") {
  CHECK(last_boxed_only_string("a \\boxed{1+{2}} b \\boxed{\\frac{1}{2}} c") == "\\boxed{\\frac{1}{2}}");
  CHECK(extract_boxed_answer("so $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$") ==
        "\\left( 3, \\frac{\\pi}{2} \\right)");
  CHECK(extract_boxed_answer("\\fbox{7} is it") == "7");
  CHECK(extract_boxed_answer("\\boxed{}") == "");
  CHECK_FALSE(extract_boxed_answer("no answer here").has_value());
  CHECK_FALSE(extract_boxed_answer("\\boxed{12").has_value());  // never closes
}

TEST_CASE("eval math: the `\\boxed 5` form wins whenever it occurs and ends at the next $") {
  CHECK(last_boxed_only_string("The answer is $\\boxed 5$.") == "\\boxed 5");
  CHECK(extract_boxed_answer("The answer is $\\boxed 5$.") == "5");
  // Even when a braced box comes later, as the reference's early return does.
  CHECK(extract_boxed_answer("$\\boxed 3$ or \\boxed{4}") == "3");
}

TEST_CASE("eval math: normalisation steps, one by one") {
  CHECK(strip_string("\\left(x-2\\right)\\left(x+2\\right)") == "(x-2)(x+2)");
  CHECK(strip_string("\\dfrac{1}{2}") == "\\frac{1}{2}");
  CHECK(strip_string("\\tfrac83") == "\\frac{8}{3}");
  CHECK(strip_string("\\frac1{72}") == "\\frac{1}{72}");
  CHECK(strip_string("\\frac34i") == "\\frac{3}{4}i");
  CHECK(strip_string("90^\\circ") == "90");
  CHECK(strip_string("90^{\\circ}") == "90");
  CHECK(strip_string("\\$10") == "10");
  CHECK(strip_string("10\\text{ units}") == "10");
  CHECK(strip_string("50\\%") == "50");
  CHECK(strip_string("50%") == "50");
  CHECK(strip_string(".5") == "\\frac{1}{2}");  // leading "." -> "0.5" -> special case
  CHECK(strip_string("{.5}") == "{0.5}");
  CHECK(strip_string("x = .25") == "0.25");  // " ." -> " 0.", then the short left side goes
  CHECK(strip_string("xy = 5") == "xy=5");   // left side "xy " has three characters: kept
  CHECK(strip_string("\\sqrt2") == "\\sqrt{2}");
  CHECK(strip_string("1/2") == "\\frac{1}{2}");
  CHECK(strip_string("-1/2") == "\\frac{-1}{2}");
  CHECK(strip_string("01/2") == "01/2");  // int("01") prints as "1": not canonical, kept
  CHECK(strip_string("1/2/3") == "1/2/3");
  CHECK(strip_string("a\nb") == "ab");
  CHECK(strip_string("3\\!000") == "3000");
  CHECK(strip_string("\\\\frac{1}{2}") == "\\frac{1}{2}");
  CHECK(strip_string("") == "");
  CHECK(strip_string("\\frac1") == "\\frac1");  // one character after \frac: the input comes back
}

TEST_CASE("eval math: is_equiv cases from the reference's own tests") {
  CHECK_FALSE(equiv("\\tfrac{1}{2} + \\frac1{72}", "\\\\frac{1}{2} + 2/3"));
  CHECK_FALSE(equiv("10, 4, -2", "4, 10, -2"));
  CHECK(equiv("\\tfrac{1}{2} +\\! \\frac1{72}", "\\\\dfrac{1}{2} +\\frac{1}{72}"));
  CHECK(equiv("10\\text{ units}", "10 "));
  CHECK_FALSE(equiv("10\\text{ units}", "100 "));
  CHECK(equiv("10", "\\$10"));
  CHECK_FALSE(equiv("0.1, 4, 2", "4, .1, 2"));
  CHECK(equiv("0.1", ".1"));
  CHECK(equiv("10\\%", "10"));
  CHECK(equiv("10\\sqrt{3} + \\sqrt4", "10\\sqrt3 + \\sqrt{4}"));
  CHECK(equiv("\\tfrac83", "\\frac{8}{3}"));
  CHECK_FALSE(equiv("5x - 7y + 11z + 4 = 0", "x + y - z + 2 = 0"));
  CHECK(equiv("1/2", "\\frac{1}{2}"));
}

TEST_CASE("eval math: string rules, not mathematics") {
  CHECK_FALSE(equiv("0.25", "\\frac{1}{4}"));  // equal numbers, different strings
  CHECK_FALSE(equiv("2", "2.0"));
  CHECK_FALSE(equiv("\\frac{2}{4}", "\\frac{1}{2}"));
  CHECK(equiv("0.5", "\\frac{1}{2}"));  // the one special case
  CHECK(equiv("k = 0.5", "\\frac12"));
  CHECK(equiv("x=5", "5"));
}

TEST_CASE("eval math: when normalising raises, the raw strings are compared") {
  // "\sqrt" with nothing after it and "\frac" at the end raise in the reference.
  CHECK_THROWS(strip_string("\\sqrt"));
  CHECK_THROWS(strip_string("2\\frac"));
  CHECK_THROWS(strip_string("1\\text{ m}\\text{ s}"));  // two unit texts fail its assertion
  CHECK(equiv("\\sqrt", "\\sqrt"));
  CHECK_FALSE(equiv("\\sqrt", "\\sqrt "));
  CHECK_FALSE(equiv("1\\text{ m}\\text{ s}", "1"));
  CHECK(equiv("1\\text{ m}\\text{ s}", "1\\text{ m}\\text{ s}"));
  CHECK(is_equiv(std::nullopt, std::nullopt));
  CHECK_FALSE(is_equiv(std::string("1"), std::nullopt));
}

TEST_CASE("eval math: a sample scores 1 when its last boxed answer matches any gold answer") {
  ScoreContext context;
  context.gold = {"\\frac{1}{2}"};
  SampleScore s = score_sample(Metric::math, "First \\boxed{3}, then finally \\boxed{\\dfrac12}.", context);
  CHECK(s.score == 1.0);
  CHECK(s.extracted == "\\dfrac12");
  CHECK(score_sample(Metric::math, "I think 1/2", context).score == 0.0);  // nothing boxed
  context.gold = {"The answer is $\\boxed{7}$."};                          // a solution as gold
  CHECK(score_sample(Metric::math, "\\boxed{7}", context).score == 1.0);
}

}  // namespace
}  // namespace choreo::eval
