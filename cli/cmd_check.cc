// `choreo check`: validates a workflow without a model (docs/workflow-language.md, "Checking a workflow"):
// compiles it to a plan, prints a summary (calls, batches, agents and their steps) and the information-flow
// report. Exit 0 when clean, 1 when a private message can reach another agent, 2 for an invalid workflow.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>

#include "cli/common.h"
#include "dsl/flow.h"
#include "dsl/plan/dot.h"
#include "dsl/plan/plan.h"
#include "dsl/plan/step_graph.h"
#include "dsl/plan/steps_to_execution.h"
#include "dsl/workflow_parser.h"
#include "common/error.h"

namespace choreo::cli {

namespace {

using dsl::plan::Plan;

struct CheckOptions {
  std::string workflow_path;
  std::vector<std::string> inputs, params;
  std::string dot;  // "", "agents" or "calls"
  bool no_leak = false;
  bool steps = false;
  int64_t max_steps = dsl::kDefaultMaxSteps;
};

std::string names_of(const Plan& plan, const std::vector<size_t>& ids, size_t limit) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ids.size() && i < limit; ++i) names.push_back(plan.nodes[ids[i]].name);
  if (ids.size() > limit) names.push_back(fmt::format("… ({} more)", ids.size() - limit));
  return fmt::format("{}", fmt::join(names, ", "));
}

void print_summary(const Plan& plan, const dsl::plan::StepGraph& graph) {
  size_t decodes = 0, prefills = 0;
  for (const dsl::plan::Node& n : plan.nodes) {
    decodes += n.kind == dsl::plan::NodeKind::Decode;
    prefills += n.kind == dsl::plan::NodeKind::Prefill;
  }
  std::cout << fmt::format("{}: {} call(s) ({} decode, {} prefill) and {} declared messages in {} steps\n",
                           plan.file, plan.call_count(), decodes, prefills,
                           plan.nodes.size() - plan.call_count(), plan.batches.size());
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    const dsl::plan::Batch& batch = plan.batches[b];
    std::cout << fmt::format("  step {:>2}: {} ×{}{}  {}\n", b, kind_name(batch.kind), batch.nodes.size(),
                             batch.conditional ? " (conditional)" : "", names_of(plan, batch.nodes, 6));
  }
  for (const dsl::plan::UnrolledLoop& loop : plan.loops)
    std::cout << fmt::format("  repeat `{}` at {}: {} iterations{}\n", loop.variable, loop.where.to_string(),
                             loop.iterations, loop.may_stop_early ? ", may stop early (`until`)" : "");
  std::cout << "agent step graph:\n";
  for (const std::string& agent : graph.agents) {
    std::vector<std::string> steps;
    for (const dsl::plan::AgentStep& s : graph.steps.at(agent))
      steps.push_back(fmt::format("{}{}", s.step, s.conditional ? "?" : ""));
    std::cout << fmt::format("  {} runs at steps {}\n", agent, fmt::join(steps, ", "));
  }
  for (const dsl::plan::AgentEdge& e : graph.edges)
    std::cout << fmt::format("  {} -> {}: {} reads{}{}{}\n", e.from, e.to, e.reads, e.loop ? ", loop" : "",
                             e.selection ? ", selection" : "",
                             e.conditional && !e.selection ? ", conditional" : "");
  for (const std::string& note : plan.notes) std::cout << "note: " << note << "\n";
}

std::string steps_text(const std::optional<size_t>& steps) { return steps ? std::to_string(*steps) : "-"; }

/// `--steps`: every agent's steps-to-execution before the first step and after each step completes (the run
/// taking every conditional step), and each message's at the start.
void print_steps(const Plan& plan) {
  dsl::plan::StepClock clock(plan);
  std::cout << "steps to execution (KVFlow: a step is a plan batch; the minimum over steps the run may "
               "skip, the maximum over a join's parents; - = never again):\n";
  auto line = [&](const std::string& when) {
    std::vector<std::string> parts;
    for (const std::string& agent : clock.agents())
      parts.push_back(fmt::format("{} {}", agent, steps_text(clock.for_agent(agent))));
    std::cout << fmt::format("  {:<14} {}\n", when + ":", fmt::join(parts, ", "));
  };
  line("start");
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    clock.complete(b);
    line(fmt::format("after step {}", b));
  }
  dsl::plan::StepClock start(plan);
  std::vector<std::string> parts;
  for (size_t n = 0; n < plan.nodes.size(); ++n)
    parts.push_back(fmt::format("{} {}", plan.nodes[n].name, steps_text(start.for_message(n))));
  std::cout << fmt::format("messages, steps until next read at the start: {}\n", fmt::join(parts, ", "));
}

/// True when the leak happens only if the run makes certain choices (a call it may skip, a selection).
bool is_possible_only(const Plan& plan, const dsl::Leak& leak) {
  std::vector<size_t> chain = leak.path;
  chain.push_back(leak.reader);
  for (size_t k = 0; k < chain.size(); ++k) {
    const dsl::plan::Node& node = plan.nodes[chain[k]];
    if (node.conditional) return true;
    if (k == 0) continue;
    for (const dsl::plan::Edge& e : node.parents)
      if (e.parent == chain[k - 1] && e.selection) return true;
  }
  return false;
}

/// Prints the report; returns the number of leaks plus violations.
size_t print_flow(const Plan& plan) {
  const std::vector<dsl::FlowMessage> messages = dsl::flow_messages(plan);
  const dsl::FlowReport report = dsl::analyze_flow(messages);
  std::cout << fmt::format(
      "information flow: {} leak{} through cached encodings, {} visibility violation{}\n",
      report.leaks.size(), report.leaks.size() == 1 ? "" : "s", report.violations.size(),
      report.violations.size() == 1 ? "" : "s");
  for (const dsl::Leak& leak : report.leaks) {
    const dsl::plan::Node& source = plan.nodes[leak.source];
    const dsl::plan::Node& reader = plan.nodes[leak.reader];
    std::string line = fmt::format("{} (private to {})", source.name, source.private_to);
    for (size_t k = 1; k < leak.path.size(); ++k) line += " -> encoded into " + plan.nodes[leak.path[k]].name;
    line += fmt::format(" -> read by {} in {}",
                        reader.agent.empty() ? "a call without an agent" : reader.agent, reader.name);
    std::cout << fmt::format("  {}: leak: {}{}\n", reader.where.to_string(), line,
                             is_possible_only(plan, leak) ? " (possible: depends on run-time choices)" : "");
  }
  for (const dsl::VisibilityViolation& v : report.violations) {
    const dsl::plan::Node& message = plan.nodes[v.message];
    const dsl::plan::Node& reader = plan.nodes[v.reader];
    std::cout << fmt::format(
        "  {}: visibility: {} reads {}, which is private to {}\n", reader.where.to_string(),
        reader.agent.empty() ? "a call without an agent" : reader.agent + " in " + reader.name, message.name,
        message.private_to);
  }
  return report.leaks.size() + report.violations.size();
}

/// How print_no_leak shows a tracker name: `x#7` as `x`, `x#7 for bob` (a fresh encoding) as
/// `x (fresh for bob)`; nested fresh names keep only the outermost reader.
std::string shown_name(const std::string& tracked) {
  const size_t hash = tracked.find('#');
  const size_t fresh = tracked.rfind(" for ");
  if (fresh == std::string::npos || fresh < hash) return tracked.substr(0, hash);
  return fmt::format("{} (fresh for {})", tracked.substr(0, hash), tracked.substr(fresh + 5));
}

std::vector<std::string> shown_names(const std::vector<std::string>& tracked) {
  std::vector<std::string> out;
  for (const std::string& t : tracked) out.push_back(shown_name(t));
  return out;
}

/// What `run --no-leak` would do, simulated on the plan with FlowTracker::clean (the rule of
/// runtime/exec/leak_guard.h): before each call, every parent whose encoding carries another agent's private
/// message is replaced by a fresh encoding. Returns the number of visibility violations (which re-encoding
/// cannot fix).
size_t print_no_leak(const Plan& plan) {
  dsl::FlowTracker tracker;
  std::vector<std::string> names(plan.nodes.size());  // the tracker's name of each node's encoding
  std::set<std::string> made;
  std::string lines;
  for (size_t id = 0; id < plan.nodes.size(); ++id) {
    const dsl::plan::Node& node = plan.nodes[id];
    names[id] = fmt::format("{}#{}", node.name, id);  // unique even when a name is rebound in a loop
    std::vector<std::string> parents;
    for (const dsl::plan::Edge& e : node.parents) {
      const std::string& original = names[e.parent];
      const std::string cleaned = tracker.clean(original, node.agent);
      parents.push_back(cleaned);
      if (cleaned == original) continue;
      const bool reused = !made.insert(cleaned).second;
      lines += fmt::format(
          "  {} ({}): reads {} instead of {}{}\n", node.name, node.agent.empty() ? "no agent" : node.agent,
          shown_name(cleaned), shown_name(original),
          reused ? ""
                 : fmt::format(" (whose encoding carries {})",
                               fmt::join(shown_names(tracker.foreign_private(node.agent, original)), ", ")));
    }
    tracker.add(names[id], node.agent, node.private_to, parents);
  }
  std::cout << fmt::format("with --no-leak, run would read these fresh encodings:\n{}", lines);
  // Fresh encodings made while cleaning others are listed too.
  for (std::vector<std::string> work(made.begin(), made.end()); !work.empty();) {
    const std::string fresh = work.back();
    work.pop_back();
    for (const std::string& parent : tracker.parents_of(fresh))
      if (parent.rfind(" for ") != std::string::npos && made.insert(parent).second) work.push_back(parent);
  }
  for (const std::string& fresh : made)
    std::cout << fmt::format("  {} = the text of {} with parents [{}]\n", shown_name(fresh),
                             shown_name(fresh.substr(0, fresh.find(" for "))),
                             fmt::join(shown_names(tracker.parents_of(fresh)), ", "));
  const dsl::FlowReport report = dsl::analyze_flow(dsl::flow_messages(plan));
  if (!report.violations.empty())
    std::cout << fmt::format(
        "{} visibility violation{} remain (a call reads another agent's private message "
        "directly; re-encoding cannot fix that)\n",
        report.violations.size(), report.violations.size() == 1 ? "" : "s");
  return report.violations.size();
}

void run_check(const CheckOptions& o) {
  dsl::plan::Arguments arguments{key_values(o.inputs, "--input"), key_values(o.params, "--param"), o.max_steps};
  const dsl::Workflow workflow = dsl::load_workflow(o.workflow_path);
  const Plan plan = dsl::plan::compile(workflow, arguments);
  const dsl::plan::StepGraph graph = dsl::plan::agent_step_graph(plan);
  if (o.dot == "agents") {
    std::cout << dsl::plan::agent_graph_dot(plan, graph) << std::flush;
    return;
  }
  if (o.dot == "calls") {
    std::cout << dsl::plan::call_graph_dot(plan) << std::flush;
    return;
  }
  print_summary(plan, graph);
  if (o.steps) print_steps(plan);
  const size_t findings = o.no_leak ? print_no_leak(plan) : print_flow(plan);
  std::cout << std::flush;
  if (findings > 0) std::exit(1);  // a finding, not an error: the report above says what and where
}

}  // namespace

void register_check(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "validate a workflow without a model: plan summary, agent step graph, information-flow (leak) report; "
      "exit 0 clean, 1 leaks found, 2 invalid");
  cmd->add_option("workflow", o->workflow_path, "workflow YAML file")->required();
  add_pairs_option(*cmd, "--input", o->inputs, "an input value, KEY=VALUE (repeatable; inputs not given are unknown)");
  add_pairs_option(*cmd, "--param", o->params, "override a param, KEY=VALUE (repeatable)");
  cmd->add_flag("--dot{agents}", o->dot,
                "print the agent step graph (--dot) or the call DAG (--dot=calls) as Graphviz DOT instead")
      ->check(CLI::IsMember({"agents", "calls"}));
  cmd->add_flag("--no-leak", o->no_leak,
                "show what `run --no-leak` re-encodes fresh instead of the leaks (exit 1 only for visibility "
                "violations)");
  cmd->add_flag("--steps", o->steps,
                "also print every agent's steps-to-execution (KVFlow) at the start and after each step, and "
                "each message's at the start");
  add_max_steps_option(*cmd, o->max_steps);
  cmd->callback([o] { run_check(*o); });
}

}  // namespace choreo::cli
