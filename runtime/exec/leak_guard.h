#pragma once
// `--no-leak` (DESIGN.md §4, information flow): a message private to agent P must not reach agent Q ≠ P through
// a cached encoding. Before a call by Q runs, every parent whose encoding transitively attended to a message
// private to someone else is replaced by a fresh encoding of the same tokens at the same position whose own
// parents are cleaned the same way (and whose parents private to others are dropped). Fresh encodings are
// ordinary messages, so the engine's content keys share them between calls and instances.
//
// Runs on the thread that owns the engine. Only the choreo mode needs it: the chat-API baselines re-encode
// every parent from its text, so nothing reaches a call except the tokens it is given.

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dsl/flow.h"
#include "runtime/engine/engine.h"

namespace choreo::exec {

/// Rewrites the parents of calls so that no encoding carries another agent's private messages. The rule is
/// dsl::FlowGraph's (dsl/flow.h), the one `choreo check` applies; this class only maps engine message ids
/// to its indices and makes its fresh encodings on the engine.
class LeakGuard {
 public:
  explicit LeakGuard(runtime::Engine& engine) : engine_(engine) {}

  /// Cleans the parents of each request for the request's agent (a call without an agent is nobody's: every
  /// private message is someone else's). Returns how many fresh encodings it made.
  int apply(std::vector<runtime::PrefillRequest>& requests);
  int apply(std::vector<runtime::DecodeRequest>& requests);

  /// The agents whose private messages the encoding of `id` attended to, directly or through its parents.
  std::set<std::string> taint(kv::MessageId id);

  /// Fresh encodings made so far.
  int n_reencoded() const { return n_reencoded_; }

 private:
  template <typename Request>
  int apply_to(std::vector<Request>& requests);
  size_t index_of(kv::MessageId id);
  kv::MessageId clean(kv::MessageId id, const std::string& reader);

  runtime::Engine& engine_;
  dsl::FlowGraph graph_;
  std::map<kv::MessageId, size_t> index_;  // engine message -> graph index
  std::vector<kv::MessageId> ids_;         // graph index -> engine message
  int n_reencoded_ = 0;
};

}  // namespace choreo::exec
