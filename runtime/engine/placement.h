#pragma once
// Where a call's parents and its new message sit in logical positions (DESIGN.md §2, "Omitted offsets").

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/kv/message_store.h"

namespace choreo::runtime {

/// A parent as a call names it: a message and an optional logical start position. `n_tokens` limits the
/// view to the message's first n tokens (used by prefix reuse; encoding is causal so a prefix is valid).
struct Parent {
  kv::MessageId message = kv::kNoMessage;
  std::optional<int> offset;
  std::optional<int> n_tokens;
};

/// A parent after placement.
struct PlacedView {
  kv::MessageId message = kv::kNoMessage;
  int offset = 0;    // logical start
  int n_tokens = 0;  // tokens visible
  int delta = 0;     // offset - the message's encoded start
};

/// The resolved layout of one call.
struct Placement {
  std::vector<PlacedView> parents;
  int new_start = 0;
};

/// Applies the default-offset rules: the first parent starts at `first_pos` (1 after BOS, else 0), each later
/// one right after the previous parent in the list ends, and the new message right after the rightmost parent
/// token (max end over all parents). Explicit offsets override. Throws InputError for an unknown parent, a
/// negative offset, or a layout that does not fit in n_ctx together with `n_new_tokens`.
/// With `require_encoded`, a parent whose tokens are not all encoded yet is an error too.
Placement place(const kv::MessageStore& store, std::span<const Parent> parents, std::optional<int> new_offset,
                int first_pos, int n_new_tokens, int n_ctx, bool require_encoded = true);

/// A new message in `store` that starts at `placement.new_start` and records the placed parents its encoding
/// attends to, holding `tokens` (none encoded yet), to be encoded by model `model` of the engine.
kv::Message& new_message(kv::MessageStore& store, const Placement& placement, const std::string& agent,
                         kv::Visibility visibility, std::vector<Token> tokens, int model);

}  // namespace choreo::runtime
