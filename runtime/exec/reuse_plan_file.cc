#include "runtime/exec/reuse_plan_file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/input_file.h"

namespace choreo::exec {

ReusePlanFile read_reuse_plan(const std::string& path) {
  const std::string text = read_input_file(path, "plan file", input_policy().file_bytes);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto bad = [&](std::string_view what) {
    return InputError(fmt::format("{}: not a reuse plan file: {}", path, what),
                      "plan files are the plan.json `choreo profile reuse -o DIR` writes");
  };
  if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
  if (j.value("choreo_reuse_plan", 0) != 1) throw bad("no \"choreo_reuse_plan\": 1");
  ReusePlanFile out;
  const auto model = [&](const char* key, uint64_t& fingerprint, std::string& spec) {
    if (!j.contains(key) || !j[key].is_object() || !j[key].contains("fingerprint") || !j[key]["fingerprint"].is_string())
      throw bad(fmt::format("no {}.fingerprint", key));
    const std::string hex = j[key]["fingerprint"];
    size_t used = 0;
    try {
      fingerprint = std::stoull(hex, &used, 16);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != hex.size() || hex.empty()) throw bad(fmt::format("{}.fingerprint is not hexadecimal", key));
    spec = j[key].value("spec", "?");
  };
  model("sender", out.sender, out.sender_spec);
  model("receiver", out.receiver, out.receiver_spec);
  if (!j.contains("n_layers") || !j["n_layers"].is_number_integer()) throw bad("no n_layers");
  out.n_layers = j["n_layers"];
  const std::string kind = j.value("plan", "");
  if (kind == "reuse") {
    out.plan.kind = runtime::CrossModelPlan::Kind::Reuse;
  } else if (kind == "partial") {
    out.plan.kind = runtime::CrossModelPlan::Kind::Partial;
    if (!j.contains("layers") || !j["layers"].is_array()) throw bad("a partial plan without layers");
    for (const nlohmann::json& r : j["layers"]) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer())
        throw bad("layers must be [[first, end], ...]");
      out.plan.ranges.push_back({r[0].get<int>(), r[1].get<int>()});
    }
  } else if (kind != "recompute") {
    throw bad("plan must be recompute, reuse or partial");
  }
  return out;
}

}  // namespace choreo::exec
