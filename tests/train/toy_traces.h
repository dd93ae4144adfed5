#pragma once
// The toy workflow of the fine-tuning tests: one decode after a story about a name, and traces in which every
// row's decode generated the same continuation, which a LoRA adapter learns in a few steps.

#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_models.h"

namespace choreo::testing {

inline constexpr const char* kToyWorkflow = R"Y(name: toy
inputs:
  name: string
messages:
  story: {text: "{{ name }} went to the park."}
steps:
  - decode: {as: next, parents: [story], header: " Then", max_tokens: 10, temperature: 0}
output: "{{ next }}"
)Y";

inline constexpr const char* kToyNames[] = {"Tom", "Lily", "Ben", "Sue", "Max", "Mia",
                                            "Sam", "Amy",  "Tim", "Kim", "Dan", "Ann"};
/// Ten stories260K tokens. (The story's end is not part of it: stories260K never learned to emit EOS, whose
/// output row is untrained, so a frozen output projection cannot make it likely.)
inline constexpr const char* kToyContinuation = " she saw a big red dog.";

/// Writes traces of kToyWorkflow, one per name, in which every row's decode generated kToyContinuation (each
/// line passed through `edit` first, when given).
inline void write_fixed_traces(const std::string& path,
                               const std::function<void(nlohmann::json&)>& edit = {}) {
  const std::vector<int32_t> tokens = stories260k().model->vocab().tokenize(kToyContinuation, false);
  REQUIRE(tokens.size() == 10);
  std::ofstream out(path);
  for (size_t i = 0; i < std::size(kToyNames); ++i) {
    nlohmann::json t = {{"line", i + 1},
                        {"inputs", {{"name", kToyNames[i]}}},
                        {"params", nlohmann::json::object()},
                        {"max_steps", 100000},
                        {"calls", {{{"name", "next"}, {"generated", tokens}}}}};
    if (edit) edit(t);
    out << t.dump() << "\n";
  }
}

}  // namespace choreo::testing
