#pragma once
// The agent step graph (KVFlow): agents as nodes, an edge A → B when a call of B reads a message a call of A
// produced, and for each agent the steps (batch indices of the plan) at which it runs. A workflow-aware cache
// gives each message the steps-to-execution of the agents that will read it next; this graph is where that
// look-ahead comes from before the run.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsl/plan/plan.h"

namespace choreo::dsl::plan {

/// A dependency between two agents, summed over every read of one's message by the other's calls.
struct AgentEdge {
  std::string from;          ///< the agent that produced the message
  std::string to;            ///< the agent whose call reads it
  size_t reads = 0;          ///< how many (call, parent) pairs make this edge
  bool loop = false;         ///< some read crosses `repeat` iterations (a back edge of the loop)
  bool conditional = false;  ///< some read happens in a call the run may skip
  bool selection = false;    ///< some read is one of the candidates of a run-time choice
};

/// One step at which an agent runs.
struct AgentStep {
  size_t step = 0;           ///< the plan's batch index
  bool conditional = false;  ///< every call of the agent in that batch is conditional
};

/// The agent step graph of a plan.
struct StepGraph {
  std::vector<std::string> agents;                      ///< in order of first appearance
  std::vector<AgentEdge> edges;                         ///< sorted by (from, to)
  std::map<std::string, std::vector<AgentStep>> steps;  ///< per agent, increasing
};

/// The agent a call counts as in the graph: its `agent:`, else its `as` base name (so a workflow without
/// declared agents still has one graph node per call site, e.g. `answer`, `vote`). Declared messages
/// belong to no agent: they are read, never produced, by agents.
std::string graph_agent(const Node& node);

/// Builds the graph from a plan.
StepGraph agent_step_graph(const Plan& plan);

/// Steps from `current_step` until `agent` next runs (0: it runs at this step), or nullopt if it never runs
/// again: the KVFlow steps-to-execution of that agent.
std::optional<size_t> steps_to_execution(const StepGraph& graph, const std::string& agent,
                                         size_t current_step);

}  // namespace choreo::dsl::plan
