#pragma once
// Information flow through cached encodings (DESIGN.md §4; the Prisoner's Dilemma finding of Bai & Eisner).
// Attention is not transitive (DESIGN.md §2), but an encoding is: the keys and values of a message encoded
// with parents [A] were computed from A. So a message private to agent P reaches agent Q ≠ P when a call by
// Q has a parent M whose encoding attended, directly or through its own parents' encodings, to P's message.
// That is a *leak*. A call by Q whose parent *is* P's private message is a plainer mistake, a *visibility
// violation*; both are reported. A call without an agent owns nothing, so it may read no private message.
//
// Two entry points: analyze_flow() over a whole compiled plan (`choreo check`), and FlowTracker, the same
// analysis built up message by message, with the re-encoding rule of `choreo run --no-leak`
// (runtime/exec/leak_guard.h) so that `choreo check --no-leak` can show what the run would re-encode.

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dsl/plan/plan.h"

namespace choreo::dsl {

/// A message as information flow sees it.
struct FlowMessage {
  std::string name;
  std::string agent;            ///< who made it (the reader, for a call); "" for none
  std::string private_to;       ///< its owner when private; "" when public
  std::vector<size_t> parents;  ///< indices of earlier messages whose encodings its encoding attended to
  bool is_call = true;          ///< false for declared messages: they read nothing
};

/// A path by which a private message reaches another agent: `path.front()` is the private message, each
/// later element was encoded with the one before it as a parent, and the reader's call has `path.back()`
/// as a parent. `path` is a shortest such chain (one witness for this source, parent and reader).
struct Leak {
  size_t source = 0;
  std::vector<size_t> path;
  size_t reader = 0;
};

/// A call whose parent is itself private to another agent.
struct VisibilityViolation {
  size_t message = 0;
  size_t reader = 0;
};

/// Everything analyze_flow() found, ordered by reader, then parent (in parent order), then source.
struct FlowReport {
  std::vector<Leak> leaks;
  std::vector<VisibilityViolation> violations;
};

/// For each message, the private messages its encoding carries (its parents that are private, and what
/// its parents' encodings carry), sorted; a message does not carry itself.
std::vector<std::vector<size_t>> carried_private(std::span<const FlowMessage> messages);

/// Every (private message, parent, reader call) leak and every visibility violation. Parents must come
/// before their children.
FlowReport analyze_flow(std::span<const FlowMessage> messages);

/// The plan's nodes as flow messages, with the same indices.
std::vector<FlowMessage> flow_messages(const plan::Plan& plan);

/// Information flow tracked while a workflow runs, by message name (a later message with the same name
/// replaces the earlier one for lookups, as a rebinding does in the interpreter).
class FlowTracker {
 public:
  /// Records a message after it is encoded; `private_to` is its owner or "". Every parent must have been
  /// added (std::invalid_argument otherwise).
  void add(const std::string& name, const std::string& agent, const std::string& private_to,
           std::span<const std::string> parents);

  /// The parents of a call by `reader` whose encodings carry a message private to another agent — the
  /// ones `run --no-leak` must re-encode fresh. A parent that is itself private to another agent is a
  /// visibility violation, not listed here.
  std::vector<std::string> leaking_parents(const std::string& reader,
                                           std::span<const std::string> parents) const;

  /// The private messages carried by the encoding of `name` that `reader` may not see.
  std::vector<std::string> foreign_private(const std::string& reader, const std::string& name) const;

  /// What `run --no-leak` reads instead of `name` in a call by `reader` (runtime/exec/leak_guard.h): `name`
  /// itself when its encoding carries nothing private to another agent; else a fresh encoding of the same
  /// text whose parents private to others are dropped and whose other parents are cleaned the same way.
  /// Fresh encodings are added to the tracker as "NAME for READER" (or "NAME for no agent") and reused.
  std::string clean(const std::string& name, const std::string& reader);

  /// The parents of a tracked message, in order.
  std::vector<std::string> parents_of(const std::string& name) const;

 private:
  size_t index_of(const std::string& name) const;
  size_t clean_at(size_t id, const std::string& reader);
  size_t append(FlowMessage message);

  std::vector<FlowMessage> messages_;
  std::vector<std::vector<size_t>> carried_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::pair<size_t, std::string>, size_t> cleaned_;  // (message, reader) -> fresh encoding
};

}  // namespace choreo::dsl
