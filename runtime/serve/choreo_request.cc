#include "runtime/serve/choreo_request.h"

#include <fmt/format.h>

#include <array>
#include <span>
#include <string_view>

#include "common/suggest.h"
#include "runtime/serve/json_fields.h"

namespace choreo::serve {

using nlohmann::json;

namespace {

/// Longest ttl or pin lease a client may ask for: a day (the server's --max-pin-s bounds pins further).
constexpr int64_t kMaxTtlSeconds = 86400;

/// Fails on a key of `object` (at `param`) that is not one of `known`, naming the closest.
void only_known(const json& object, const std::string& param, std::span<const std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (std::string_view k : known) found = found || key == k;
    if (found) continue;
    std::string names;
    for (std::string_view k : known) names += fmt::format("{}{}", names.empty() ? "" : ", ", k);
    throw bad(param + "." + key,
              with_suggestion(fmt::format("unknown field '{}' in '{}'", key, param), key, known) +
                  fmt::format(" (it takes: {})", names),
              "unknown_parameter");
  }
}

std::string id_value(const json& object, const char* name, const std::string& param, bool required) {
  const std::string id = text(object, name, required, param);
  if ((required || field(object, name)) && (id.empty() || id.size() > kMaxIdBytes))
    throw bad(param, fmt::format("'{}' must be 1 to {} bytes long", param, kMaxIdBytes));
  return id;
}

/// A ttl: seconds as a number, or a string with a unit ("90s", "5m", "1h").
std::chrono::milliseconds parse_ttl(const json& v, const std::string& param) {
  double seconds = -1;
  if (v.is_number()) {
    seconds = v.get<double>();
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const char unit = s.empty() ? '\0' : s.back();
    const double scale = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3600 : 0;
    size_t used = 0;
    double amount = -1;
    try {
      amount = std::stod(s.substr(0, s.size() - 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (scale > 0 && used > 0 && used == s.size() - 1) seconds = amount * scale;
  } else {
    throw bad(param,
              fmt::format("'{}' must be seconds (a number) or a string such as \"5m\", not {}", param,
                          json_type(v)),
              "invalid_type");
  }
  if (!(seconds > 0 && seconds <= double(kMaxTtlSeconds)))
    throw bad(param,
              fmt::format("'{}' must be more than 0 and at most {} seconds (a number, or a string such as "
                          "\"90s\", \"5m\", \"1h\")",
                          param, kMaxTtlSeconds));
  return std::chrono::milliseconds(int64_t(seconds * 1000));
}

RetentionHint parse_retention(const json& v, const std::string& param) {
  if (!v.is_object())
    throw bad(param, fmt::format("'{}' must be an object {{pin, ttl, priority}}", param), "invalid_type");
  static constexpr std::array<std::string_view, 3> kKnown = {"pin", "ttl", "priority"};
  only_known(v, param, kKnown);
  RetentionHint r;
  r.pin = boolean(v, "pin", false, param + ".pin");
  if (const json* ttl = field(v, "ttl")) r.ttl = parse_ttl(*ttl, param + ".ttl");
  r.priority = int(integer(v, "priority", -1000, 1000, 0, param + ".priority"));
  return r;
}

const json* choreo_object(const json& holder, const std::string& param) {
  const json* c = field(holder, "choreo");
  if (c && !c->is_object()) throw bad(param, fmt::format("'{}' must be an object", param), "invalid_type");
  return c;
}

}  // namespace

bool is_item_reference(const json& message) {
  if (!message.is_object()) return false;
  const auto type = message.find("type");
  return type != message.end() && *type == "item_reference";
}

bool uses_extensions(const json& body, const json* list) {
  if (field(body, "choreo")) return true;
  if (!list || !list->is_array()) return false;
  for (const json& m : *list)
    if (m.is_object() && (field(m, "choreo") || is_item_reference(m))) return true;
  return false;
}

ChoreoItem parse_reference(const json& entry, const std::string& param) {
  static constexpr std::array<std::string_view, 2> kKnown = {"type", "id"};
  only_known(entry, param, kKnown);
  ChoreoItem item;
  item.param = param;
  item.reference = true;
  item.id = id_value(entry, "id", param + ".id", true);
  return item;
}

void parse_message_extension(const json& message, const std::string& param, ChoreoItem& item) {
  item.param = param;
  const std::string where = param + ".choreo";
  const json* c = choreo_object(message, where);
  if (!c) return;
  static constexpr std::array<std::string_view, 2> kKnown = {"id", "retention"};
  only_known(*c, where, kKnown);
  item.id = id_value(*c, "id", where + ".id", false);
  if (const json* r = field(*c, "retention")) item.retention = parse_retention(*r, where + ".retention");
}

void parse_request_extension(const json& body, ChoreoRequest& out) {
  const json* c = choreo_object(body, "choreo");
  if (!c) return;
  static constexpr std::array<std::string_view, 6> kKnown = {"output_id", "retention", "workflow_id",
                                                             "agent_id",  "step_id",   "next"};
  only_known(*c, "choreo", kKnown);
  out.output_id = id_value(*c, "output_id", "choreo.output_id", false);
  if (const json* r = field(*c, "retention")) out.retention = parse_retention(*r, "choreo.retention");
  out.workflow_id = id_value(*c, "workflow_id", "choreo.workflow_id", false);
  out.agent_id = id_value(*c, "agent_id", "choreo.agent_id", false);
  if (field(*c, "step_id"))
    out.step_id = uint64_t(integer(*c, "step_id", 0, int64_t(1) << 53, 0, "choreo.step_id"));
  if (const json* next = field(*c, "next")) {
    if (!next->is_object())
      throw bad("choreo.next",
                "'choreo.next' must be an object naming agents and their steps to execution, e.g. "
                "{\"critic\": 1, \"writer\": 2}",
                "invalid_type");
    for (const auto& [agent, steps] : next->items()) {
      const std::string param = "choreo.next." + agent;
      if (agent.empty() || agent.size() > kMaxIdBytes)
        throw bad(param, fmt::format("agent ids in 'choreo.next' must be 1 to {} bytes long", kMaxIdBytes));
      out.next.emplace_back(agent, uint64_t(integer(*next, agent.c_str(), 0, 1 << 20, 0, param)));
    }
  }
  if ((out.step_id || !out.next.empty()) && out.workflow_id.empty())
    throw bad("choreo.workflow_id",
              "'choreo.step_id' and 'choreo.next' need a 'choreo.workflow_id' they belong to",
              "missing_required_parameter");
}

}  // namespace choreo::serve
