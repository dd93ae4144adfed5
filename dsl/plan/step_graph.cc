#include "dsl/plan/step_graph.h"

#include <algorithm>

namespace choreo::dsl::plan {

namespace {

/// True when `child` reads `parent` from an earlier iteration of a loop both are in.
bool crosses_iterations(const Node& parent, const Node& child) {
  const size_t common = std::min(parent.iterations.size(), child.iterations.size());
  for (size_t k = 0; k < common; ++k) {
    if (parent.iterations[k].loop != child.iterations[k].loop) return false;
    if (parent.iterations[k].index != child.iterations[k].index) return true;
  }
  return false;
}

}  // namespace

std::string graph_agent(const Node& node) {
  if (node.kind == NodeKind::Message) return {};
  return node.agent.empty() ? node.base : node.agent;
}

StepGraph agent_step_graph(const Plan& plan) {
  StepGraph graph;
  std::map<std::pair<std::string, std::string>, AgentEdge> edges;
  std::map<std::string, std::map<size_t, bool>> steps;  // agent -> step -> every call there conditional
  for (const Node& node : plan.nodes) {
    const std::string agent = graph_agent(node);
    if (agent.empty()) continue;
    if (std::find(graph.agents.begin(), graph.agents.end(), agent) == graph.agents.end())
      graph.agents.push_back(agent);
    auto [it, added] = steps[agent].emplace(node.batch, node.conditional);
    if (!added) it->second = it->second && node.conditional;
    for (const Edge& e : node.parents) {
      const Node& parent = plan.nodes[e.parent];
      const std::string from = graph_agent(parent);
      if (from.empty()) continue;
      AgentEdge& edge = edges[{from, agent}];
      edge.from = from;
      edge.to = agent;
      ++edge.reads;
      edge.loop = edge.loop || crosses_iterations(parent, node);
      edge.conditional = edge.conditional || node.conditional || e.selection;
      edge.selection = edge.selection || e.selection;
    }
  }
  for (auto& [key, edge] : edges) graph.edges.push_back(edge);
  for (const auto& [agent, at] : steps)
    for (const auto& [step, conditional] : at) graph.steps[agent].push_back({step, conditional});
  return graph;
}

std::optional<size_t> steps_to_execution(const StepGraph& graph, const std::string& agent,
                                         size_t current_step) {
  auto it = graph.steps.find(agent);
  if (it == graph.steps.end()) return std::nullopt;
  for (const AgentStep& s : it->second)
    if (s.step >= current_step) return s.step - current_step;
  return std::nullopt;
}

}  // namespace choreo::dsl::plan
