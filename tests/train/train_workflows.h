#pragma once
// A small workflow for the fine-tuning tests: two documents, two questions prefilled in parallel over them
// (encoded at one offset, so neither sees the other), an answer that reads the documents reordered and both
// questions, and a second decode over a document and the answer.

namespace choreo::testing {

inline constexpr const char* kReorderedWorkflow = R"Y(name: reordered
messages:
  a: {text: "Once upon a time there was a cat."}
  b: {text: "Tom had a red ball."}
steps:
  - prefill: {as: "q[i]", for: "i in range(2)", text: " Question {{ i }}: who played?", parents: [a, b]}
  - decode: {as: ans, parents: [b, a, "q[i] for i in range(2)"], header: " Then", max_tokens: 6, temperature: 0}
  - decode: {as: more, parents: [a, ans], header: " And", max_tokens: 4, temperature: 0}
output: "{{ more }}"
)Y";

}  // namespace choreo::testing
