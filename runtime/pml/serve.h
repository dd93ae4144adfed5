#pragma once
// Serving a PML prompt on the engine: the imported modules' encodings are gathered as they are (no
// recomputation), arguments, cache="false" pieces and uncached text are encoded at their positions, and one
// decode over all of them generates the reply. On the message store a prompt is a decode whose parents are
// the imported modules' messages at their schema positions.

#include <optional>
#include <string>
#include <vector>

#include "dsl/pml/ast.h"
#include "runtime/engine/engine.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/prompt_plan.h"

namespace choreo::runtime::pml {

/// Generation settings of a prompt (the engine's decode settings).
struct ServeOptions {
  model::SamplingParams sampling;     // temperature 0 = greedy
  int max_tokens = 256;
  std::vector<std::string> stop;
  int logprobs = 0;
  bool record_logits = false;
  std::optional<int> exact_tokens;
};

/// What serving a prompt did.
struct ServeResult {
  PromptPlan plan;
  std::vector<PrefillResult> prefills;  // the Fresh parts, in plan order
  DecodeResult decode;
  int n_cached_tokens = 0;              // tokens of cached pieces the decode attended to without recomputing
};

/// Plans `prompt` against `encoded` (made by encode_schema on this engine) and runs it. Throws InputError
/// for prompts that do not fit the schema (see plan_prompt) and for a schema whose encodings were released.
ServeResult serve_prompt(Engine& engine, const EncodedSchema& encoded, const dsl::pml::Prompt& prompt,
                         const ServeOptions& options);

}  // namespace choreo::runtime::pml
