#pragma once
// What a PML prompt asks of an encoded schema, before anything runs: which pieces it includes (the schema's
// own text, the imported modules' text and filled slots), the arguments and the uncached text it adds, and
// where each sits. runtime/pml/serve.h runs a plan on an engine; tests read it to check tokenisation.

#include <string>
#include <utility>
#include <vector>

#include "dsl/pml/ast.h"
#include "runtime/pml/layout.h"

namespace choreo::runtime::pml {

/// One message the prompt's decode attends to.
struct PromptPart {
  enum class Kind {
    Cached,  // a schema piece encoded ahead of time (encode_schema)
    Fresh,   // encoded for this request: an argument, a cache="false" piece, or uncached prompt text
  };
  Kind kind = Kind::Cached;
  int piece = -1;                    // the schema piece, -1 for arguments and prompt text
  std::vector<model::Token> tokens;  // what the decode sees of it (all its tokens, or all but one: see header)
  int start_pos = 0;
  std::string label;                 // "travel-plan", "travel-plan.duration", "text" (for reports)
};

/// The layout of one prompt.
struct PromptPlan {
  std::vector<PromptPart> parts;     // schema parts in position order, then uncached text in prompt order
  std::vector<model::Token> header;  // the decode's own tokens: the last uncached text (see docs/pml.md)
  int header_pos = 0;
  std::vector<int> included_modules;

  /// Every token the decode sees with its position, sorted by position (BOS excluded).
  std::vector<std::pair<int, model::Token>> positioned_tokens() const;
};

/// Resolves a prompt against a layout: imports by name in their scope (nested imports inside their parent's
/// tag, union members by their own name), arguments against the module's parameters. Throws InputError at
/// the prompt's element for an unknown schema, module or parameter, a module imported twice, two members of
/// one union, an argument longer than its parameter (both lengths in tokens), or an empty prompt.
PromptPlan plan_prompt(const Layout& layout, const dsl::pml::Prompt& prompt, const model::Model& model);

}  // namespace choreo::runtime::pml
