// LongBench's metrics (runtime/eval/longbench_metrics.h, rouge.h), each value worked by hand from the rules
// of THUDM/LongBench metrics.py and the `rouge` package it calls.

#include <doctest/doctest.h>

#include "common/error.h"
#include "runtime/eval/longbench_metrics.h"
#include "runtime/eval/metric.h"
#include "runtime/eval/python_text.h"
#include "runtime/eval/rouge.h"

namespace choreo::eval {
namespace {

/// The package's F: 2 * (p * r / (p + r + 1e-8)), from hand-counted p and r.
double rouge_f(double p, double r) { return 2.0 * ((p * r) / (p + r + 1e-8)); }

TEST_CASE("eval longbench: Python string helpers behave like Python") {
  CHECK(split_whitespace("  a\tb\n\u00a0c  ") == std::vector<std::string>{"a", "b", "c"});  // NBSP is space
  CHECK(split("a..b", ".") == std::vector<std::string>{"a", "", "b"});
  CHECK(replace_all("\\\\\\", "\\\\", "\\") == "\\\\");  // three backslashes: the first pair becomes one
  CHECK(lower("CAFÉ Ünïcode") == "café ünïcode");
  CHECK(code_point_count("é=") == 2);
}

TEST_CASE("eval longbench: SQuAD normalisation") {
  CHECK(normalize_answer("The  Cat's hat!") == "cats hat");
  CHECK(normalize_answer("an anthem, a theme") == "anthem theme");  // articles only as whole words
  CHECK(normalize_answer("A-B_C") == "abc");                        // '_' and '-' are punctuation
  CHECK(normalize_answer("“quoted”") == "“quoted”");                // curly quotes are not ASCII punctuation
}

TEST_CASE("eval longbench: qa_f1 is token F1 on normalised text") {
  // [cat sat on mat] vs [cat on mat]: 3 shared, P = 3/4, R = 1.
  CHECK(qa_f1_score("The cat sat on the mat", "a cat on a mat") == doctest::Approx(6.0 / 7.0));
  // Counts are clipped: {x:2, y:1} vs {x:1, y:2} share 2 of 3 each.
  CHECK(qa_f1_score("x x y", "x y y") == doctest::Approx(2.0 / 3.0));
  CHECK(qa_f1_score("Paris", "London") == 0.0);
  CHECK(qa_f1_score("", "") == 0.0);
  CHECK(qa_f1_score("Café", "CAFÉ") == 1.0);
}

TEST_CASE("eval longbench: Rouge-L F, summary level over sentences and sets of words") {
  // One sentence each; LCS = the cat on the mat, whose distinct words are 4 of 5 on each side.
  CHECK(rouge_l_score("the cat sat on the mat", "the cat lay on the mat") ==
        doctest::Approx(rouge_f(4.0 / 5, 4.0 / 5)).epsilon(1e-12));
  // The package's docstring example: union LCS of r = w1..w5 with c1, c2 is {w1 w2 w3 w5}; the hypothesis
  // has 8 distinct words.
  CHECK(rouge_l_score("w1 w2 w6 w7 w8. w1 w3 w8 w9 w5", "w1 w2 w3 w4 w5") ==
        doctest::Approx(rouge_f(4.0 / 8, 4.0 / 5)).epsilon(1e-12));
  // A piece of only spaces after the last "." survives the split and becomes one empty word.
  CHECK(rouge_l_score("a b. ", "a b") == doctest::Approx(rouge_f(2.0 / 3, 1.0)).epsilon(1e-12));
  CHECK(rouge_l_score("a b.", "a b") == doctest::Approx(rouge_f(1.0, 1.0)).epsilon(1e-12));
  // Nothing to split: the package raises and LongBench scores 0.
  CHECK(rouge_l_score("", "a b") == 0.0);
  CHECK(rouge_l_score("...", "a b") == 0.0);
  CHECK(rouge_l_score("a b", "") == 0.0);
  CHECK(rouge_l_score("x y", "a b") == 0.0);
}

TEST_CASE("eval longbench: classification, with the reference's list-mutation quirk") {
  const std::vector<std::string> trec = {"Abbreviation", "Entity",   "Description",
                                         "Human",        "Location", "Numeric"};
  CHECK(classification_score("Type: Location", "Location", trec) == 1.0);
  CHECK(classification_score("Location or Human", "Location", trec) == 0.5);
  CHECK(classification_score("no idea", "Location", trec) == 0.0);
  CHECK(classification_score("Human", "Location", trec) == 0.0);
  // "event" is inside the gold "sports event" and is pruned.
  CHECK(classification_score("sports event", "sports event", {"event", "sports event"}) == 1.0);
  // Removing while iterating skips the element after each removal: "y" survives, so 1/2, not 1.
  CHECK(classification_score("xyz", "xyz", {"x", "y", "z", "xyz"}) == 0.5);
}

TEST_CASE("eval longbench: passage retrieval and count") {
  CHECK(retrieval_score("Paragraph 3", "Paragraph 3") == 1.0);
  CHECK(retrieval_score("Paragraph 3 or Paragraph 12", "Paragraph 3") == 0.5);
  CHECK(retrieval_score("I do not know", "Paragraph 3") == 0.0);
  CHECK_THROWS_AS(retrieval_score("3", "the third"), InputError);
  CHECK(count_score("There are 5 unique paragraphs out of 12", "5") == 0.5);
  CHECK(count_score("05", "5") == 0.0);        // strings are compared, not values
  CHECK(count_score("5 \u0665", "5") == 0.5);  // Arabic-Indic five is a \d, but not "5"
  CHECK(find_numbers("a1b22c333") == std::vector<std::string>{"1", "22", "333"});
}

TEST_CASE("eval longbench: a sample's score is the max over gold answers, some datasets keep one line") {
  ScoreContext context;
  context.gold = {"the city of Paris", "Paris"};
  CHECK(score_sample(Metric::qa_f1, "Paris", context).score == 1.0);
  context.gold = {"Location"};
  context.all_classes = {"Human", "Location"};
  context.dataset = "trec";
  CHECK(score_sample(Metric::classification, "\n\nLocation\nHuman", context).score == 1.0);
  context.dataset = "other";
  CHECK(score_sample(Metric::classification, "\n\nLocation\nHuman", context).score == 0.5);
  context.gold.clear();
  CHECK_THROWS_AS(score_sample(Metric::qa_f1, "x", context), InputError);
}

TEST_CASE("eval longbench: metric names and LongBench's dataset table") {
  for (std::string_view name : metric_names()) CHECK(metric_name(parse_metric(name)) == name);
  CHECK_THROWS_AS(parse_metric("rouge"), InputError);
  CHECK(metric_for_dataset("musique") == Metric::qa_f1);
  CHECK(metric_for_dataset("multi_news") == Metric::rouge_l);
  CHECK(metric_for_dataset("multi_news_e") == Metric::rouge_l);
  CHECK(metric_for_dataset("passage_count") == Metric::count);
  CHECK_FALSE(metric_for_dataset("lcc").has_value());
}

}  // namespace
}  // namespace choreo::eval
