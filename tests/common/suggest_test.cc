// The one "did you mean" (common/suggest.h): distances worked by hand, the closeness rule, and the one
// message format that the workflow parser, expressions, `choreo exec` and `choreo eval` all show.

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/suggest.h"

namespace choreo {
namespace {

TEST_CASE("suggest: edit distance counts inserts, deletes, substitutions and neighbour swaps, ignoring case") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("strat", "start") == 1);  // one swap
  CHECK(edit_distance("modle", "model") == 1);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("Steps", "steps") == 0);
  CHECK(edit_distance("ca", "abc") == 3);  // optimal string alignment, not full Damerau
}

TEST_CASE("suggest: a third of the letters (1 to 3 edits), no exact match, no long names") {
  const std::vector<std::string> names = {"temperature", "max_tokens", "steps", "x"};
  CHECK(closest_name("tempreature", names) == "temperature");
  CHECK(closest_name("max_token", names) == "max_tokens");
  CHECK(closest_name("Steps", names) == "steps");
  CHECK(closest_name("steps", names).empty());  // already right
  CHECK(closest_name("zzz", names).empty());
  CHECK(closest_name("y", names) == "x");
  CHECK(closest_name(std::string(65, 'x'), names).empty());
  const std::vector<std::string_view> views = {"prefill", "decode"};
  CHECK(closest_name("prefil", views) == "prefill");
}

TEST_CASE("suggest: one message format, as a hint and appended to a message") {
  const std::vector<std::string> names = {"answer"};
  const std::vector<std::string_view> views = {"answer"};
  CHECK(did_you_mean("ansewr", names) == "did you mean 'answer'?");
  CHECK(did_you_mean("ansewr", views) == "did you mean 'answer'?");
  CHECK(did_you_mean("qqq", names).empty());
  CHECK(with_suggestion("unknown name 'ansewr'", "ansewr", names) == "unknown name 'ansewr' — did you mean 'answer'?");
  CHECK(with_suggestion("unknown name 'ansewr'", "ansewr", views) == "unknown name 'ansewr' — did you mean 'answer'?");
  CHECK(with_suggestion("unknown name 'qqq'", "qqq", names) == "unknown name 'qqq'");
}

}  // namespace
}  // namespace choreo
