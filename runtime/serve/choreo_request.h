#pragma once
// choreo's request extensions (docs/serve.md, "choreo's extensions"): one `choreo` object on the request or
// on a message, and `{"type": "item_reference", "id": …}` entries in the message list. A request that has any
// of them is run through the engine's message path (runtime/serve/choreo_decoder.h) instead of the plain
// prefix cache. This file holds what they say, parsed and checked; it knows nothing of the engine.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace choreo::serve {

/// `choreo.retention`: how long a message should stay in fast memory.
struct RetentionHint {
  bool pin = false;                              // keep it in T0: a lease, refreshed on each hit
  std::optional<std::chrono::milliseconds> ttl;  // unused this long, it leaves T0 first (and a pin's lease)
  int priority = 0;                              // lower leaves first
};

/// One entry of an extension request's message list: a message (with its text), or a reference to one that
/// an earlier request named.
struct ChoreoItem {
  std::string param;       // where it is in the body, for errors: messages[2]
  bool reference = false;  // {"type": "item_reference", "id": …}
  std::string id;          // the id it refers to, or the message's choreo.id ("": none)
  std::string role, text;  // a message's role (system, user, assistant) and content
  std::optional<RetentionHint> retention;
};

/// The extensions of one request.
struct ChoreoRequest {
  std::vector<ChoreoItem> items;           // the prompt, in order
  std::string output_id;                   // the id the answer gets ("": the server names it)
  std::optional<RetentionHint> retention;  // for the answer
  // KVFlow's step graph, as the client sees it (feeds --evict workflow).
  std::string workflow_id, agent_id;
  std::optional<uint64_t> step_id;
  std::vector<std::pair<std::string, uint64_t>> next;  // agents and their steps to execution
};

/// Ids are 1 to this many bytes.
inline constexpr size_t kMaxIdBytes = 256;

/// True when `message` (an element of a message list) is `{"type": "item_reference", …}`.
bool is_item_reference(const nlohmann::json& message);
/// True when the request uses an extension: a `choreo` object on it or on one of `list`'s entries, or an
/// item_reference in `list` (null: no list).
bool uses_extensions(const nlohmann::json& body, const nlohmann::json* list);

/// The item of an item_reference entry at `param`. ApiError 400 for a missing or bad id, or other fields.
ChoreoItem parse_reference(const nlohmann::json& entry, const std::string& param);
/// Reads a message's `choreo` object (id, retention) into `item`, whose role and text are set. ApiError 400
/// names the field that is wrong.
void parse_message_extension(const nlohmann::json& message, const std::string& param, ChoreoItem& item);
/// Reads the request's `choreo` object (output_id, retention, workflow_id, agent_id, step_id, next) into
/// `out`.
void parse_request_extension(const nlohmann::json& body, ChoreoRequest& out);

}  // namespace choreo::serve
