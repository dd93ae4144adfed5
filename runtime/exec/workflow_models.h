#pragma once
// The models a workflow declares under `models:` (docs/workflow-language.md, "Models"), loaded beside the
// run's model into the set an engine runs calls on (runtime/engine/model_set.h).

#include <filesystem>
#include <functional>
#include <string>
#include <memory>
#include <string_view>
#include <vector>

#include "dsl/workflow.h"
#include "runtime/engine/model_set.h"
#include "runtime/engine/open_engine.h"

namespace choreo::exec {

/// A model set and the weights it points to that the run's model is not.
struct WorkflowModels {
  std::vector<std::unique_ptr<model::Model>> owned;
  runtime::ModelSet set;
};

/// A file the workflow `w` names at `name` (`what` says which kind, for errors): as given when it exists, else
/// relative to the workflow's directory; either way it must lie inside the workflow's directory or one allowed
/// with --allow-path (common/input_file.h, docs/limits.md). InputError at `name` otherwise.
std::filesystem::path find_workflow_file(const dsl::Workflow& w, const dsl::Text& name, std::string_view what);

/// Model 0 is the run's model `base` with `base_lora` (the command line's adapters); then each model the
/// workflow declares, in file order: its `file:` (find_workflow_file; absent: `base`'s weights) on `base`'s
/// backend, each file loaded once, with its adapters (and plan files, found the same way). A missing,
/// unreadable or unconfined file, an adapter for other weights, or weights that cannot run beside `base` is an
/// InputError at the declaration.
WorkflowModels load_workflow_models(const dsl::Workflow& workflow, const model::Model& base,
                                    model::LoraStack base_lora);

/// The same, as the runtime::ModelOptions::add_models of an engine opened for `workflow` (which must
/// outlive the call of load_models): adds the workflow's models to a set whose model 0 is the run's model.
std::function<void(const model::Model&, runtime::ModelSet&, runtime::ExtraModels&)> workflow_models_adder(
    const dsl::Workflow& workflow);

/// The model a run of `workflow` loads: `flag_path` (-m) when given; else the workflow's `model:`, found as
/// find_workflow_file finds it; else empty (the default model).
std::string workflow_model_path(const dsl::Workflow& workflow, const std::string& flag_path);

}  // namespace choreo::exec
