#pragma once
// What `choreo run` writes of a run besides the streamed decodes, shared with `choreo serve`'s workflow
// endpoint (cli/serve_workflows.h), which answers with exactly what run prints and its --json record.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsl/workflow.h"
#include "runtime/exec/instances.h"

namespace choreo::cli {

/// The JSON document `choreo run --json` writes: the workflow, model, mode and the engine's tiers (`tiers`,
/// EngineFlags::tiers_json), then the run (`rows` empty) or one entry per row; a failed instance keeps what
/// it did before its error, marked incomplete.
nlohmann::ordered_json run_document(const dsl::Workflow& workflow, const std::string& mode, bool no_leak,
                                    nlohmann::ordered_json tiers, const std::string& model_path,
                                    const std::vector<exec::InputRow>& rows,
                                    const std::vector<exec::InstanceOutcome>& outcomes);

/// The workflow's output as run prints it after the decodes (without colours): "── output\n" OUTPUT "\n".
std::string output_block(const std::string& output);

}  // namespace choreo::cli
