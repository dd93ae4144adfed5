#pragma once
// Plan files (`plan.json`) that `choreo profile reuse` writes and workflows name under a model's `reuse:`
// (docs/workflow-language.md, "Models"; docs/profile.md, "Reuse plans").

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/engine/model_set.h"

namespace choreo::exec {

/// A plan file `choreo profile reuse` wrote (`plan.json`): the plan it chose for a receiver reading a sender,
/// both named by the fingerprint of their weights and adapters (runtime::EngineModel::fingerprint).
struct ReusePlanFile {
  uint64_t sender = 0, receiver = 0;
  std::string sender_spec, receiver_spec;  // as the profile named them (for messages)
  int n_layers = 0;
  runtime::CrossModelPlan plan;
};
/// Reads a plan file; InputError naming the file and the field when it is not one.
ReusePlanFile read_reuse_plan(const std::string& path);
/// Sets the file's plan from every model of `set` with the sender's fingerprint (but `receiver`) to
/// `receiver`; returns how many senders it found. InputErrors of ModelSet::set_plan pass through.
int apply_reuse_plan(runtime::ModelSet& set, const ReusePlanFile& file, int receiver);

/// What read_reuse_plan reads, as the profiler writes it: `sender` and `receiver` are objects with a
/// hexadecimal `fingerprint` and a `spec` (the profile adds its scores beside these fields).
nlohmann::ordered_json reuse_plan_json(const nlohmann::ordered_json& sender, const nlohmann::ordered_json& receiver,
                                       int n_layers, const runtime::CrossModelPlan& plan);

}  // namespace choreo::exec
