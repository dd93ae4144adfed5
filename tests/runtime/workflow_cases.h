#pragma once
// The workflows tests run end to end: every workflow in workflows/ (but musique.yaml, which needs data
// files) with small arguments, and every workflow of the test corpus in tests/workflows/.

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "runtime/exec/interpreter.h"

namespace choreo::testing {

struct WorkflowCase {
  std::filesystem::path file;
  exec::RunArguments arguments;
  bool chat = false;  ///< needs the chat model (a PML schema with roles)
};

inline std::filesystem::path workflow_source_dir() {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  return src ? src : ".";
}

inline std::vector<WorkflowCase> workflow_cases() {
  const std::filesystem::path w = workflow_source_dir() / "workflows";
  std::vector<WorkflowCase> out = {
      {w / "hello.yaml", {{{"question", "Why is the sky blue?"}}, {}}},
      {w / "docqa.yaml", {{{"context", "The lighthouse was built in 1871 by Mara Voss."},
                           {"question", "Who built the lighthouse?"}}, {}}},
      {w / "multiqa.yaml", {{{"document", "Tom has three cats: Ada, Bo and Cy."},
                             {"questions", "['Which cat is the oldest?', 'What does Bo like?']"}}, {}}},
      {w / "madpar.yaml", {{{"problem", "What is 12 * 7 - 5?"}}, {{"rounds", "2"}}}},
      {w / "tot.yaml", {{{"problem", "What is 1 + 3 + 5?"}}, {{"branches", "3"}, {"voters", "2"}}}},
      {w / "maditer.yaml", {{{"question", "Is zero even?"}}, {{"rounds", "2"}}}},
      {w / "bsm.yaml", {{{"task", "Write about the sea and the mountains."}}, {}}},
      {w / "prisoners.yaml", {}},
      {w / "travel.yaml", {{{"days", "3"}}, {}}, true},
      {w / "solvecheck.yaml", {{{"problem", "What is 7 * 8 - 6?"}}, {{"rounds", "2"}}}, true},
  };
  for (const auto& entry : std::filesystem::directory_iterator(workflow_source_dir() / "tests" / "workflows"))
    if (entry.path().extension() == ".yaml") out.push_back({entry.path(), {}});
  return out;
}

}  // namespace choreo::testing
