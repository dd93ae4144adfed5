#pragma once
// What the engine's modes (Mode: choreo, prefix, naive) do differently, behind one interface: how a decode
// call's prompt is laid out in the cache, which message its result names, and what a mode remembers of
// finished calls. Everything else (validation, encoding, the sampling and stepping loop, stop strings) is the
// engine's, once for all modes. Each mode lives in its own file: mode_choreo.cc, mode_naive.cc,
// mode_prefix.cc.

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/placement.h"
#include "runtime/engine/requests.h"
#include "runtime/kv/message_store.h"

namespace choreo::runtime {

/// What a mode works with: the engine's message store and the bounds of its positions.
struct ModeContext {
  kv::MessageStore& store;
  int first_pos = 0;  // the first parent's position: 1 after the implicit BOS, 0 for models without BOS
  int n_ctx = 0;      // positions the model can attend over
};

/// One decode call as its mode laid it out in the cache.
struct DecodeLayout {
  /// What the call encodes (its pending tokens) and extends with each generated token.
  kv::Message* encoded = nullptr;
  /// What `encoded` attends to besides the implicit BOS and itself.
  std::vector<PlacedView> views;
  /// The message DecodeResult::id names: `encoded` itself, or a text-only message.
  kv::Message* result = nullptr;
  /// Cached tokens attended to without recomputation (CallStats::n_reused).
  int n_reused = 0;
};

/// The mode-specific part of the engine's calls.
class CallMode {
 public:
  virtual ~CallMode() = default;
  /// Whether prefill calls encode their tokens. A mode that does not (the chat-API baselines) keeps each
  /// prefill as text only, for its decode calls to re-encode; such messages have no encoding to persist or
  /// load.
  virtual bool encodes_prefills() const = 0;
  /// Creates the messages of decode call #`index` (`budget`: the tokens it may generate) in the store, with
  /// the pending tokens the engine encodes before sampling. Throws InputError for an unknown parent or a
  /// layout that does not fit in the context.
  virtual DecodeLayout lay_out_decode(const DecodeRequest& request, size_t index, int budget) = 0;
  /// Called once the call is complete: `layout.encoded` holds every token, generated ones included, encoded
  /// and published. `generated` excludes the header (DecodeResult::generated).
  virtual void finish_decode(const DecodeRequest& request, const DecodeLayout& layout,
                             std::span<const model::Token> generated) = 0;
  /// Called before message `id` is released, so the mode drops what refers to it.
  virtual void forget(kv::MessageId id) {}
};

std::unique_ptr<CallMode> make_choreo_mode(ModeContext context);  // mode_choreo.cc
std::unique_ptr<CallMode> make_naive_mode(ModeContext context);   // mode_naive.cc
std::unique_ptr<CallMode> make_prefix_mode(ModeContext context);  // mode_prefix.cc

}  // namespace choreo::runtime
