#pragma once
// Static checks on a parsed workflow that need no expression evaluated: names are defined once, parents and
// `message:` refer to things defined earlier (so the call graph is acyclic by construction), fan-outs write
// indexed names, and `agent:`/`private:` name declared agents.

#include "dsl/workflow.h"
#include "dsl/yaml_errors.h"

namespace choreo::dsl {

/// Throws an InputError (with location, quoted line and hint) for the first problem found.
void check_workflow(const Workflow& workflow, const SourceFile& file);

}  // namespace choreo::dsl
