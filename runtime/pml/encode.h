#pragma once
// Ahead-of-time encoding of a PML schema on the engine (Prompt Cache's "module encoding"): every cached
// piece becomes one prefill message at its schema position whose parents are its scaffold — the cached
// pieces before it in the schema (union members other than the union's scaffold member excluded; each
// member encoded in its own pass over what precedes the union). Parameter slots hold their placeholder or
// scaffold= tokens. Messages carry content keys, so encoding the same schema again computes nothing.

#include <functional>
#include <vector>

#include "dsl/pml/ast.h"
#include "runtime/engine/engine.h"
#include "runtime/pml/layout.h"

namespace choreo::runtime::pml {

/// A schema's layout with the engine message of each cached piece.
struct EncodedSchema {
  Layout layout;
  std::vector<kv::MessageId> messages;  // per piece; kv::kNoMessage for pieces encoded per request
  int n_computed = 0;                   // tokens run through the model by this encoding
  int n_deduplicated = 0;               // pieces found already encoded (same content key)
  double total_ms = 0;
};

/// Lays out `schema` for the engine's model and encodes it. Independent pieces (union members, pieces whose
/// scaffolds are ready) go through the engine together as one prefill batch. A cached piece that ends past
/// the engine's context is an InputError at that piece, before anything is encoded.
EncodedSchema encode_schema(Engine& engine, const dsl::pml::Schema& schema);

/// Encodes an existing layout (made for the engine's model).
EncodedSchema encode_layout(Engine& engine, Layout layout);

/// Runs one batch of prefills somewhere (an engine, or a workflow interpreter's call sink).
using PrefillBatch = std::function<std::vector<PrefillResult>(std::vector<PrefillRequest>)>;

/// Encodes a layout through `prefill` (the same waves of batches as above) on an engine whose context holds
/// `n_ctx` positions. The waves are found in one pass: a piece joins the wave after its scaffold_last's, so
/// the time spent outside the engine grows with the scaffolds the requests list, not with pieces x waves.
EncodedSchema encode_layout(const PrefillBatch& prefill, Layout layout, int n_ctx);

/// Throws InputError at the first cached piece of `layout` that ends past `n_ctx` positions: encoding it
/// would fail, after the pieces before it had been encoded.
void check_layout_fits(const Layout& layout, int n_ctx);

}  // namespace choreo::runtime::pml
