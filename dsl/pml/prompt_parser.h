#pragma once
// PML prompts → dsl::pml::Prompt: `<prompt schema="...">` holding imports (`<module-name arg="..."/>`, nested
// for modules inside modules), uncached text anywhere between them (all kept, in order) and chat-turn tags.
// Which names exist is checked against a schema later (runtime/pml/prompt_plan.h), where the model is known.

#include <string_view>

#include "dsl/pml/ast.h"

namespace choreo::dsl::pml {

/// Parses prompt text whose first character sits at `start` (a file's 1:1, or a place inside a workflow file).
Prompt parse_prompt(std::string_view text, const SourceLocation& start);

}  // namespace choreo::dsl::pml
