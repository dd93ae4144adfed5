#pragma once
// Requests with choreo's extensions (runtime/serve/choreo_request.h), run through the engine's message path:
// the same Engine calls `choreo exec` makes. Each entry of a request's message list is a message of the
// global cache, placed at its place in the list (default offsets): a message with text is prefilled over the
// entries before it (as a chat turn, so a request without references is exactly its chat prompt), an
// item_reference (or a known choreo.id with the same text) is the message an earlier request named, read
// where it now sits (virtual repositioning); the answer is decoded over every entry. So a request's text is
// what `choreo exec` gives for the same calls, bit for bit (batch-invariant kernels), whatever else the
// server is doing.
//
// Requests that arrive together share forward passes, as `run --concurrency` does: their new messages are
// prefilled in waves (each wave one prefill batch: a message waits for the new messages before it), then
// every answer is decoded in one batch (static batching: a request arriving meanwhile waits for the next
// group). Used on the engine thread only.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/serve/bounded_map.h"
#include "runtime/serve/choreo_request.h"
#include "runtime/serve/generation.h"
#include "runtime/serve/serve_hints.h"

namespace choreo::serve {

/// What a generation with extensions asks for (`ignore_eos`: exactly max_tokens tokens, exec's exact_tokens;
/// `ext.output_id` must be set: the server names the answers clients leave unnamed).
struct ExtensionRequest : GenerationSettings {
  ChoreoRequest ext;
  std::string agent;
};

/// One generation with extensions in flight.
class ExtensionGeneration : public Generation {
 public:
  explicit ExtensionGeneration(ExtensionRequest request) : request_(std::move(request)) {}
  const ExtensionRequest& request() const { return request_; }

 private:
  ExtensionRequest request_;
};

/// What a name a client gave a message (choreo.id, choreo.output_id, or the id the server gave an answer)
/// stands for.
struct NamedMessage {
  kv::MessageId message = kv::kNoMessage;
  uint64_t text_hash = 0;  // of its role and text: the name given to another text is a conflict (409)
  std::string role;        // its turn's role
  std::string closing;     // an answer's turn suffix the model did not write: the next turn starts with it
};

/// What the decoder did so far (GET /metrics).
struct ExtensionStats {
  uint64_t groups = 0;          // groups of requests run together
  uint64_t decode_batches = 0;  // and the decodes in them
  uint64_t decodes = 0;
  uint64_t prefill_batches = 0;
  uint64_t prefills = 0;
  uint64_t deferred = 0;  // requests that waited for an answer another request was generating
};

class ChoreoDecoder {
 public:
  /// Over `engine` (its hints oracle is registered there while the decoder lives); at most `max_names`
  /// names are kept (the least recently used go: their messages stay, reachable by content only).
  ChoreoDecoder(runtime::Engine& engine, PinLimits pins, size_t max_names);
  ~ChoreoDecoder();
  ChoreoDecoder(const ChoreoDecoder&) = delete;
  ChoreoDecoder& operator=(const ChoreoDecoder&) = delete;

  /// Asked before a group runs to free `bytes` of T0 (the plain requests' idle sessions go first).
  void set_make_room(std::function<void(size_t bytes)> make_room) { make_room_ = std::move(make_room); }
  /// Runs generations that arrived together; each ends (finished or failed) except those that name an answer
  /// another of them is generating: they are returned, to run with the next group.
  std::vector<std::shared_ptr<ExtensionGeneration>> run(
      std::vector<std::shared_ptr<ExtensionGeneration>> group);

  const ExtensionStats& stats() const { return stats_; }
  const ServeHints& hints() const { return hints_; }
  size_t names() const { return names_.size(); }

 private:
  struct Slot;
  struct NewMessage;
  struct Plan;
  struct Group;
  struct Defer {};  // thrown by resolve(): the request waits for the next group
  static uint64_t text_hash(const std::string& role, const std::string& text);
  void resolve(Group& group, Plan& plan);
  Slot existing(const NamedMessage& named) const;
  /// A new turn of `role` after the plan's slots so far: the whole message with `text`, else its prefix (the
  /// answer's header).
  std::vector<model::Token> turn_tokens(const Plan& plan, const std::string& role,
                                        const std::optional<std::string>& text) const;
  /// The messages of the plan's first `n` slots, at default offsets.
  static std::vector<runtime::Parent> parents_of(const Group& group, const Plan& plan, size_t n);
  void prefill_waves(Group& group);
  void decode_all(Group& group);
  void finish(Group& group, Plan& plan, runtime::DecodeResult result, const runtime::DecodeRequest& request);
  PromptUsage usage_of(const Group& group, const Plan& plan) const;
  /// Retention hints, pin leases' hits and the workflow's step; pins refused go to `out`.
  void apply_hints(const Group& group, const Plan& plan, GenerationResult& out);

  runtime::Engine& engine_;
  ServeHints hints_;
  BoundedMap<NamedMessage> names_;
  std::function<void(size_t)> make_room_;
  ExtensionStats stats_;
};

}  // namespace choreo::serve
