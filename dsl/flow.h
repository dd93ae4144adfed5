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
#include <functional>
#include <map>
#include <optional>
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

/// What a call can see, defined once for `choreo check` (FlowTracker, analyze_flow) and `choreo run
/// --no-leak` (exec::LeakGuard, which keys it by engine message id): messages in encoding order, each with
/// its owner ("" when public) and the parents its encoding attended to. An encoding carries the private
/// messages among its parents and everything they carry; it leaks to a reader when it carries a message
/// private to someone else (a call without an agent, reader "", owns nothing). The cure is `clean`.
class FlowGraph {
 public:
  /// A message private to `owner` may not reach `reader`.
  static bool is_foreign(const std::string& owner, const std::string& reader) {
    return !owner.empty() && owner != reader;
  }

  /// Adds a message encoded over `parents` (earlier indices, in order); returns its index.
  size_t add(std::string owner, std::vector<size_t> parents);

  size_t size() const { return owners_.size(); }
  const std::string& owner(size_t i) const { return owners_[i]; }
  const std::vector<size_t>& parents(size_t i) const { return parents_[i]; }
  /// The private messages the encoding of `i` carries (sorted; never `i` itself).
  const std::vector<size_t>& carried(size_t i) const { return carried_[i]; }

  /// True when the encoding of `i` carries a message private to someone other than `reader`.
  bool leaks_to(size_t i, const std::string& reader) const;

  /// Builds the fresh encoding `clean` asks for: `original` is the message re-encoded; `parents` holds, for
  /// each of its parents in order, nullopt when dropped (private to another agent: the leak itself) or the
  /// index to use instead (itself cleaned). Must add() the new message and return its index.
  using MakeFresh = std::function<size_t(size_t original, const std::vector<std::optional<size_t>>& parents)>;

  /// What `reader` reads instead of `i`: `i` itself when its encoding leaks nothing to `reader`; else a
  /// fresh encoding of the same tokens whose parents private to others are dropped and whose other parents
  /// are cleaned the same way, made once per (message, reader) by `make`.
  size_t clean(size_t i, const std::string& reader, const MakeFresh& make);

 private:
  std::vector<std::string> owners_;
  std::vector<std::vector<size_t>> parents_;
  std::vector<std::vector<size_t>> carried_;
  std::map<std::pair<size_t, std::string>, size_t> cleaned_;
};

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
  size_t append(FlowMessage message);

  FlowGraph graph_;
  std::vector<FlowMessage> messages_;  // by graph index
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace choreo::dsl
