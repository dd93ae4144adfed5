#include "runtime/kv/message_store.h"

#include "common/clock.h"

#include <cassert>

#include <xxhash.h>

namespace choreo::kv {

namespace {

/// The seed of content keys: the model's fingerprint, and the KV cache types unless both are f32 (the keys
/// of f32 encodings are those written before other types existed). Encodings in different types are
/// different content, so a store shared by engines of different types holds both.
uint64_t seed_of(const kernels::KvLayout& layout, uint64_t model_fingerprint) {
  if (layout.is_f32()) return model_fingerprint;
  const uint32_t types[2] = {uint32_t(layout.k_type), uint32_t(layout.v_type)};
  return XXH3_64bits_withSeed(types, sizeof(types), model_fingerprint);
}

}  // namespace

MessageStore::MessageStore(PagePool& pool, const std::vector<uint64_t>& model_fingerprints) : pool_(pool) {
  for (uint64_t f : model_fingerprints) seeds_.push_back(seed_of(pool.layout(), f));
}

uint64_t MessageStore::content_key(const std::vector<Token>& tokens, int start_pos,
                                   const std::vector<PlacedParent>& parents, int model, uint64_t variant,
                                   uint64_t repair) const {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset_withSeed(st, variant == 0 ? seeds_.at(size_t(model)) : seeds_.at(size_t(model)) ^ variant);
  int64_t header[2] = {start_pos, int64_t(tokens.size())};
  XXH3_64bits_update(st, header, sizeof(header));
  XXH3_64bits_update(st, tokens.data(), tokens.size() * sizeof(Token));
  for (const PlacedParent& p : parents) {
    int64_t rec[2] = {int64_t(get(p.message).key), p.offset};
    XXH3_64bits_update(st, rec, sizeof(rec));
  }
  // Only an encoding made over repaired parents hashes its policy: every other key is what it always was.
  if (repair != 0) XXH3_64bits_update(st, &repair, sizeof(repair));
  uint64_t key = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return key == 0 ? 1 : key;  // 0 means "no key"
}

Message& MessageStore::create() {
  auto msg = std::make_unique<Message>(pool_);
  msg->id = MessageId(messages_.size());
  msg->last_use = tick();
  msg->last_use_ms = steady_ms();
  messages_.push_back(std::move(msg));
  ++live_;
  return *messages_.back();
}

void MessageStore::publish(Message& msg) {
  assert(msg.n_encoded == int(msg.tokens.size()));
  msg.key = content_key(msg.tokens, msg.start_pos, msg.parents, msg.model, msg.variant, msg.repair);
  by_key_.emplace(msg.key, msg.id);
  for (const PlacedParent& p : msg.parents) ++record(p.message).n_children;
}

Message* MessageStore::find(uint64_t key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  Message& m = get(it->second);
  m.last_use = tick();
  return &m;
}

Message& MessageStore::get(MessageId id) {
  assert(contains(id));
  return *messages_[id];
}

const Message& MessageStore::get(MessageId id) const {
  assert(contains(id));
  return *messages_[id];
}

Message& MessageStore::record(MessageId id) {
  assert(id < messages_.size() && messages_[id]);
  return *messages_[id];
}

const Message& MessageStore::record(MessageId id) const {
  assert(id < messages_.size() && messages_[id]);
  return *messages_[id];
}

void MessageStore::erase(MessageId id) {
  if (!contains(id)) return;
  Message& m = *messages_[id];
  if (m.key) {
    auto it = by_key_.find(m.key);
    if (it != by_key_.end() && it->second == id) by_key_.erase(it);
  }
  m.released = true;
  m.pages.clear();
  m.host = {};
  m.e_cache = {};
  m.e_charge.reset();
  --live_;
}

}  // namespace choreo::kv
