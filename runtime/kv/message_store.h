#pragma once
// The global cache of encoded messages (DESIGN.md §3): each message owns KV pages holding its tokens' keys
// and values, encoded once at a start position while attending to its parents. Identical encodings share one
// entry through a content key.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/token.h"
#include "runtime/kv/page_pool.h"

namespace choreo::kv {

using MessageId = uint32_t;
inline constexpr MessageId kNoMessage = 0xFFFFFFFFu;

/// A parent as a message was encoded: which message, and at which logical offset it was placed.
struct PlacedParent {
  MessageId message = kNoMessage;
  int offset = 0;
};

/// Who may see a message (the information-flow check reads this).
enum class Visibility { Public, Private };

/// One encoded message.
struct Message {
  MessageId id = kNoMessage;
  uint64_t key = 0;                   // content key (0 for messages that are still growing)
  std::vector<model::Token> tokens;   // everything encoded, in order (a decode: header + generated)
  int start_pos = 0;                  // logical position of tokens[0] when encoded
  std::vector<PlacedParent> parents;  // what its encoding attended to (BOS excluded)
  std::string agent;
  Visibility visibility = Visibility::Public;
  PageList pages;
  int n_encoded = 0;                  // tokens whose K/V are in `pages` (== tokens.size() when complete)
  int pins = 0;                       // > 0: must not be evicted
  uint64_t last_use = 0;

  explicit Message(PagePool& pool) : pages(pool) {}
  int end_pos() const { return start_pos + int(tokens.size()); }
};

/// Holds every message of one model; finds identical encodings by content key.
class MessageStore {
 public:
  MessageStore(PagePool& pool, uint64_t model_fingerprint);

  /// Content key of an encoding: model, tokens, start position, and each parent's key with its offset.
  uint64_t content_key(const std::vector<model::Token>& tokens, int start_pos,
                       const std::vector<PlacedParent>& parents) const;

  /// A new, empty message (not yet findable by key).
  Message& create();
  /// Makes a complete message findable by its content key (computed here and stored in msg.key).
  void publish(Message& msg);
  /// The message with this content key, or null.
  Message* find(uint64_t key);

  Message& get(MessageId id);
  const Message& get(MessageId id) const;
  bool contains(MessageId id) const { return id < messages_.size() && messages_[id] != nullptr; }
  size_t size() const { return live_; }
  /// Frees a message's pages (its id becomes invalid). Messages encoded on top of it keep their own KV.
  void erase(MessageId id);

  PagePool& pool() { return pool_; }
  uint64_t model_fingerprint() const { return fingerprint_; }
  uint64_t tick() { return ++clock_; }

 private:
  PagePool& pool_;
  uint64_t fingerprint_;
  std::vector<std::unique_ptr<Message>> messages_;
  std::unordered_map<uint64_t, MessageId> by_key_;
  size_t live_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace choreo::kv
