#include "dsl/plan/dot.h"

#include <fmt/format.h>

#include <vector>

namespace choreo::dsl::plan {

namespace {

std::string step_list(const std::vector<AgentStep>& steps) {
  std::string out;
  for (const AgentStep& s : steps) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{}{}", s.step, s.conditional ? "?" : "");
  }
  return out;
}

std::string edge_style(bool loop, bool conditional, bool selection) {
  std::vector<std::string> attributes;
  if (loop) attributes.push_back("color=blue");
  if (selection)
    attributes.push_back("style=dotted");
  else if (conditional)
    attributes.push_back("style=dashed");
  std::string out;
  for (const std::string& a : attributes) out += ", " + a;
  return out;
}

}  // namespace

std::string dot_quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string agent_graph_dot(const Plan& plan, const StepGraph& graph) {
  std::string out = fmt::format("digraph {} {{\n", dot_quote(plan.workflow + " agents"));
  out += "  node [shape=box, style=rounded];\n";
  for (const std::string& agent : graph.agents) {
    auto it = graph.steps.find(agent);
    const std::string steps = it == graph.steps.end() ? "" : step_list(it->second);
    out += fmt::format("  {} [label={}];\n", dot_quote(agent), dot_quote(agent + "\nsteps " + steps));
  }
  for (const AgentEdge& e : graph.edges) {
    std::string label = fmt::format("{}{}", e.reads, e.loop ? " (loop)" : "");
    if (e.selection) label += " (select)";
    out += fmt::format("  {} -> {} [label={}{}];\n", dot_quote(e.from), dot_quote(e.to), dot_quote(label),
                       edge_style(e.loop, e.conditional, e.selection));
  }
  return out + "}\n";
}

std::string call_graph_dot(const Plan& plan) {
  std::string out = fmt::format("digraph {} {{\n", dot_quote(plan.workflow + " calls"));
  out += "  rankdir=TB;\n";
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    const Batch& batch = plan.batches[b];
    out += fmt::format("  subgraph {} {{\n    label={};\n", dot_quote(fmt::format("cluster_{}", b)),
                       dot_quote(fmt::format("step {}: {} ×{}{}", b, kind_name(batch.kind),
                                             batch.nodes.size(), batch.conditional ? " (conditional)" : "")));
    for (size_t id : batch.nodes) {
      const Node& n = plan.nodes[id];
      const char* shape = n.kind == NodeKind::Message   ? "box"
                          : n.kind == NodeKind::Prefill ? "note"
                                                        : "ellipse";
      std::string label = n.name;
      if (!n.agent.empty()) label += "\n" + n.agent;
      if (!n.private_to.empty()) label += "\nprivate to " + n.private_to;
      out += fmt::format("    n{} [label={}, shape={}{}];\n", id, dot_quote(label), shape,
                         n.conditional ? ", style=dashed" : "");
    }
    out += "  }\n";
  }
  for (size_t id = 0; id < plan.nodes.size(); ++id) {
    const Node& n = plan.nodes[id];
    for (const Edge& e : n.parents)
      out += fmt::format("  n{} -> n{} [{}];\n", e.parent, id,
                         e.selection     ? "style=dotted"
                         : n.conditional ? "style=dashed"
                                         : "");
  }
  return out + "}\n";
}

}  // namespace choreo::dsl::plan
