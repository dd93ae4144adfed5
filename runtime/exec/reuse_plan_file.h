#pragma once
// Plan files (`plan.json`) that `choreo profile reuse` writes and workflows name under a model's `reuse:`
// (docs/workflow-language.md, "Models"; docs/profile.md, "Reuse plans").

#include <cstdint>
#include <string>

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

}  // namespace choreo::exec
