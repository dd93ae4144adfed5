#pragma once
// Keeping a schema's encoding in the persistent store (`choreo encode`, docs/pml.md): every piece's message
// that the store does not hold intact is persisted, tagged with the schema.

#include <cstdint>

#include "runtime/engine/engine.h"
#include "runtime/pml/encode.h"

namespace choreo::runtime::pml {

/// Persists every piece of `encoded` (made on `engine`, which has a persist store) whose entry the store does
/// not hold intact, with `tag`; returns how many pieces were written. Pieces sharing one message count once.
int persist_schema(Engine& engine, const EncodedSchema& encoded, uint64_t tag);

/// Tokens of the distinct messages an encoding holds (pieces with identical encodings share one message).
int encoded_tokens(const Engine& engine, const EncodedSchema& encoded);

}  // namespace choreo::runtime::pml
