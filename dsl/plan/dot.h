#pragma once
// Graphviz DOT text for a plan: the agent step graph (`choreo check --dot`) and the call DAG
// (`choreo check --dot=calls`). Pipe either into `dot -Tsvg`.

#include <string>
#include <string_view>

#include "dsl/plan/plan.h"
#include "dsl/plan/step_graph.h"

namespace choreo::dsl::plan {

/// `text` as a double-quoted DOT ID (quotes, backslashes and newlines escaped).
std::string dot_quote(std::string_view text);

/// One node per agent, labelled with the steps it runs at; one edge per dependency, labelled with its
/// number of reads; loop edges (across `repeat` iterations) are blue, conditional ones dashed, selections
/// dotted.
std::string agent_graph_dot(const Plan& plan, const StepGraph& graph);

/// One node per message (named `n<index>`, labelled with its name; declared messages as boxes, decodes as
/// ellipses, prefills as notes), one cluster per batch, one edge per parent (selections dotted, conditional
/// calls dashed).
std::string call_graph_dot(const Plan& plan);

}  // namespace choreo::dsl::plan
