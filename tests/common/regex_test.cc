// The one PCRE2 wrapper (common/regex.h): Python's findall/sub semantics used by the metrics, the search
// and match limit used by regex_match/regex_capture, and the options the pre-tokenizer needs.

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "common/regex.h"

namespace choreo {
namespace {

TEST_CASE("regex: findall returns group 1 when there is a group, the whole match otherwise") {
  CHECK(Regex(R"(\d+)").find_all("a1 b22 c333") == std::vector<std::string>{"1", "22", "333"});
  CHECK(Regex(R"(Paragraph (\d+))").find_all("Paragraph 3 and Paragraph 12") ==
        std::vector<std::string>{"3", "12"});
  CHECK(Regex(R"(x*)").find_all("axx") == std::vector<std::string>{"", "xx", ""});  // as Python's re.findall
  CHECK(Regex(R"(\w+)").find_all("héllo wörld") == std::vector<std::string>{"héllo", "wörld"});  // UCP
  CHECK(Regex(R"(\b(a|an|the)\b)").replace_all("the cat and a dog", "") == " cat and  dog");
  CHECK(Regex("é*").replace_all("aé", "-") == "-a--");  // empty matches advance a whole character
}

TEST_CASE("regex: compile errors are reported, not thrown") {
  const Regex bad("(unclosed");
  CHECK_FALSE(bad.ok());
  CHECK_FALSE(bad.compile_error().empty());
  CHECK(bad.compile_error_offset() == 9);
}

TEST_CASE("regex: search with groups, named groups and invalid UTF-8 subjects") {
  const Regex r(R"((?<word>[a-z]+)(\d)?)");
  REQUIRE(r.ok());
  CHECK(r.group_count() == 2);
  CHECK(r.group_number("word") == 1);
  CHECK(r.group_number("nope") == -1);
  std::optional<std::string> captured;
  CHECK(r.search("12 abc", 1, &captured) == Regex::Outcome::Match);
  CHECK(captured == "abc");
  CHECK(r.search("12 abc", 2, &captured) == Regex::Outcome::Match);
  CHECK_FALSE(captured.has_value());  // group 2 did not take part
  CHECK(r.search("12 \xff", 0, &captured) == Regex::Outcome::NoMatch);  // a stray byte never matches
  Regex::Match match(r);
  CHECK(r.search("ab1 cd2", 3, match) == Regex::Outcome::Match);
  CHECK(match.group(0) == std::pair<size_t, size_t>(4, 7));
  CHECK(match.group(2) == std::pair<size_t, size_t>(6, 7));
  CHECK_FALSE(match.group(5).has_value());
}

TEST_CASE("regex: the match limit stops catastrophic backtracking") {
  const std::string subject = std::string(30, 'a') + "b";
  const Regex limited("(a+)+$", Regex::Options{.match_limit = 10000});
  std::optional<std::string> captured;
  CHECK(limited.search(subject, 0, &captured) == Regex::Outcome::LimitExceeded);
  const Regex dollar("a$", Regex::Options{.dollar_end_only = true});
  CHECK(dollar.search("a\n", 0, &captured) == Regex::Outcome::NoMatch);  // $ only at the very end
  CHECK(Regex("a$").search("a\n", 0, &captured) == Regex::Outcome::Match);
}

}  // namespace
}  // namespace choreo
