#include "runtime/pml/persist.h"

#include <algorithm>
#include <vector>

namespace choreo::runtime::pml {

namespace {
std::vector<kv::MessageId> distinct_messages(const EncodedSchema& encoded) {
  std::vector<kv::MessageId> ids;
  for (kv::MessageId id : encoded.messages)
    if (id != kv::kNoMessage) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}
}  // namespace

int persist_schema(Engine& engine, const EncodedSchema& encoded, uint64_t tag) {
  int written = 0;
  for (kv::MessageId id : encoded.messages) {
    if (id == kv::kNoMessage) continue;
    // Loaded from the store, or written just before for an earlier piece: a corrupt page makes the engine
    // recompute the piece, and then the entry must be written again.
    if (engine.tier_manager().persisted(id)) continue;
    engine.persist(id, tag);
    ++written;
  }
  return written;
}

int encoded_tokens(const Engine& engine, const EncodedSchema& encoded) {
  int tokens = 0;
  for (kv::MessageId id : distinct_messages(encoded)) tokens += int(engine.store().get(id).tokens.size());
  return tokens;
}

}  // namespace choreo::runtime::pml
