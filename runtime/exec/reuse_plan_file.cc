#include "runtime/exec/reuse_plan_file.h"

#include <fmt/format.h>

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
  const auto has = [&](const nlohmann::json& o, const char* key, nlohmann::json::value_t type) {
    return o.is_object() && o.contains(key) && o[key].type() == type;
  };
  using Type = nlohmann::json::value_t;
  if (!has(j, "choreo_reuse_plan", Type::number_unsigned) || j["choreo_reuse_plan"] != 1)
    throw bad("no \"choreo_reuse_plan\": 1");
  ReusePlanFile out;
  const auto model = [&](const char* key, uint64_t& fingerprint, std::string& spec) {
    if (!j.contains(key) || !has(j[key], "fingerprint", Type::string)) throw bad(fmt::format("no {}.fingerprint", key));
    const std::string hex = j[key]["fingerprint"];
    size_t used = 0;
    try {
      fingerprint = std::stoull(hex, &used, 16);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != hex.size() || hex.empty()) throw bad(fmt::format("{}.fingerprint is not hexadecimal", key));
    spec = has(j[key], "spec", Type::string) ? j[key]["spec"].get<std::string>() : "?";
  };
  model("sender", out.sender, out.sender_spec);
  model("receiver", out.receiver, out.receiver_spec);
  if (!has(j, "n_layers", Type::number_unsigned) || j["n_layers"] > 100000) throw bad("no n_layers");
  out.n_layers = j["n_layers"].get<int>();
  const std::optional<runtime::CrossModelPlan::Kind> kind =
      has(j, "plan", Type::string) ? runtime::CrossModelPlan::parse_kind(j["plan"].get<std::string>()) : std::nullopt;
  if (!kind) throw bad("plan must be recompute, reuse or partial");
  out.plan.kind = *kind;
  if (*kind == runtime::CrossModelPlan::Kind::Partial) {
    if (!has(j, "layers", Type::array)) throw bad("a partial plan without layers");
    for (const nlohmann::json& r : j["layers"]) {
      if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer() ||
          r[0].get<int64_t>() < 0 || r[1].get<int64_t>() > 100000)
        throw bad("layers must be [[first, end], ...]");
      out.plan.ranges.push_back({r[0].get<int>(), r[1].get<int>()});
    }
  }
  return out;
}

nlohmann::ordered_json reuse_plan_json(const nlohmann::ordered_json& sender, const nlohmann::ordered_json& receiver,
                                       int n_layers, const runtime::CrossModelPlan& plan) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const runtime::LayerRange& r : plan.ranges) layers.push_back({r.begin, r.end});
  return {{"choreo_reuse_plan", 1},
          {"sender", sender},
          {"receiver", receiver},
          {"n_layers", n_layers},
          {"plan", runtime::CrossModelPlan::kind_name(plan.kind)},
          {"layers", layers},
          {"describe", plan.describe()}};
}

int apply_reuse_plan(runtime::ModelSet& set, const ReusePlanFile& file, int receiver) {
  // Every model with the sender's fingerprint is the sender (the run's model and a declared model with the
  // same file and adapters encode the same KV).
  int found = 0;
  for (size_t i = 0; i < set.size(); ++i) {
    if (set[i].fingerprint != file.sender || int(i) == receiver) continue;
    set.set_plan(int(i), receiver, file.plan);
    ++found;
  }
  return found;
}

}  // namespace choreo::exec
