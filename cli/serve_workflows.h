#pragma once
// `choreo serve --workflows DIR`: the workflows the server runs at POST /choreo/v1/workflows/{name}, with the
// inputs and params of the request's body, answering with exactly what `choreo run` prints (streamed as it
// comes) and run's --json record (docs/serve.md, "Workflows over HTTP").

#include <string>
#include <vector>

#include "cli/engine_flags.h"
#include "runtime/serve/server.h"

namespace choreo::cli {

/// The workflows of `dir`: every *.yaml and *.yml file, named by its file name without the extension, loaded
/// and checked at start-up. A run uses the server's model (as `choreo run -m` would, whatever the workflow's
/// `model:` says) and writes `model_path` and `flags`' tiers in its record. InputError for a bad file
/// (file:line:col), a directory without workflows, or a workflow that declares `models:` (not served yet).
/// Clients may set only the params named in `settable` (--workflow-params; a name no workflow declares is an
/// InputError); the rest keep the workflow's values.
serve::WorkflowRunner served_workflows(const std::string& dir, const EngineFlags& flags,
                                       const std::string& model_path, const std::vector<std::string>& settable);

}  // namespace choreo::cli
