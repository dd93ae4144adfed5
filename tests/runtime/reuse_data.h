#pragma once
// A small MuSiQue-shaped dataset for the reuse profiler's tests: three stories260K-sized passages, each with
// a question and its answer.

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace choreo::testing {

/// Writes the three rows to `path` (a JSON array, as MuSiQue's files are).
inline void write_reuse_data(const std::string& path) {
  nlohmann::json items = nlohmann::json::array();
  const char* rows[][4] = {
      {"Lily's ball", "Lily had a red ball. She liked to play with it in the park every day.",
       "What colour was the ball?", "red"},
      {"The cat", "Tom had a small cat named Max. Max liked to sleep in the sun by the window.",
       "What was the cat's name?", "Max"},
      {"The boat", "Sam and his dad made a boat. They put the boat on the lake and it went fast.",
       "Where did the boat go?", "the lake"},
  };
  for (const auto& r : rows)
    items.push_back({{"ctxs", {{{"title", r[0]}, {"text", r[1]}}}}, {"question", r[2]}, {"answers", {r[3]}}});
  std::ofstream(path) << items.dump(1);
}

}  // namespace choreo::testing
