#pragma once
// The models a workflow declares under `models:` (docs/workflow-language.md, "Models"), loaded beside the
// run's model into the set an engine runs calls on (runtime/engine/model_set.h).

#include <memory>
#include <vector>

#include "dsl/workflow.h"
#include "runtime/engine/model_set.h"

namespace choreo::exec {

/// A model set and the weights it points to that the run's model is not.
struct WorkflowModels {
  std::vector<std::unique_ptr<model::Model>> owned;
  runtime::ModelSet set;
};

/// Model 0 is the run's model `base` with `base_lora` (the command line's adapters); then each model the
/// workflow declares, in file order: its `file:` (as given, else next to the workflow; absent: `base`'s
/// weights) on `base`'s backend, each file loaded once, with its adapters. A missing or unreadable file, an
/// adapter for other weights, or weights that cannot run beside `base` is an InputError at the declaration.
WorkflowModels load_workflow_models(const dsl::Workflow& workflow, const model::Model& base,
                                    model::LoraStack base_lora);

}  // namespace choreo::exec
