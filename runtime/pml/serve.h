#pragma once
// Serving a PML prompt on the engine: the imported modules' encodings are gathered as they are (no
// recomputation), arguments, cache="false" pieces and uncached text are encoded at their positions, and one
// decode over all of them generates the reply. On the message store a prompt is a decode whose parents are
// the imported modules' messages at their schema positions. The workflow interpreter reads PML messages
// through encode_prompt too (its decode is a later call of the workflow).

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dsl/pml/ast.h"
#include "runtime/engine/engine.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/prompt_plan.h"

namespace choreo::runtime::pml {

/// One part of a prompt as a message.
struct PromptPiece {
  std::string label;                     // PromptPart::label; "text" for the prompt's closing text
  std::vector<model::Token> tokens;      // what a decode over the prompt sees of it
  int start_pos = 0;
  kv::MessageId id = kv::kNoMessage;
  std::optional<PrefillResult> encoded;  // set when encoded for this prompt (not a cached piece)
  double start_ms = 0;                   // when it was encoded, or looked up (steady_ms)
};

/// A prompt's parts as messages, in plan order: what a decode over the prompt attends to.
struct EncodedPrompt {
  PromptPlan plan;
  std::vector<PromptPiece> pieces;
  std::vector<Parent> parents;  // each piece at its position, for the decode (or the next fresh part)
  int n_cached_tokens = 0;      // tokens of cached pieces, attended to without recomputing
};

/// Plans `prompt` against `encoded` (made for `model`) and encodes its fresh parts through `prefill`, in
/// order, each over every piece before it. With `closing_text`, the prompt's last uncached text (the header
/// a decode would start from) is encoded as one more piece. `alive` (when set) says whether a cached piece's
/// message still exists: InputError when one was released. Throws InputError for prompts that do not fit the
/// schema (see plan_prompt).
EncodedPrompt encode_prompt(const PrefillBatch& prefill, const EncodedSchema& encoded, const dsl::pml::Prompt& prompt,
                            const model::Model& model, bool closing_text,
                            const std::function<bool(kv::MessageId)>& alive = {});

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
