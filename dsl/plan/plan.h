#pragma once
// A workflow compiled without a model: every message a run may create, what each one reads, and the engine
// batches in the order the interpreter issues them. `for` fan-outs and `repeat` loops are expanded with the
// params and the inputs that are known; what only a run can decide (an `until` that may stop a loop, a
// `when` that reads generated text, `select: "cot[best]"`) is kept as every possibility, marked conditional
// or as a selection. The information-flow check (dsl/flow.h), `choreo check` and the agent step graph
// (step_graph.h) read this. docs/workflow-language.md, "Checking a workflow", describes it for users.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsl/budget.h"
#include "dsl/workflow.h"
#include "common/error.h"

namespace choreo::dsl::plan {

/// What creates a node: a message declared under `messages:` (prefilled before any step) or a call.
enum class NodeKind { Message, Prefill, Decode };

/// "message", "prefill" or "decode".
const char* kind_name(NodeKind kind);

/// One parent of a node, in placement order.
struct Edge {
  size_t parent = 0;          ///< index into Plan::nodes
  std::optional<int64_t> at;  ///< explicit offset (`at:`), known before the run
  bool at_dynamic = false;    ///< `at:` reads generated text: the offset is known only at run time
  bool selection = false;     ///< one of several candidates a run-time choice picks from (`cot[best]`)
  SourceLocation where;       ///< the `parents:` entry
};

/// One iteration of an enclosing `repeat`.
struct Iteration {
  size_t loop = 0;    ///< index into Plan::loops
  int64_t index = 0;  ///< 0-based iteration number
};

/// A message a run may create.
struct Node {
  std::string name;  ///< with indices, as the interpreter names it: `answer[1][2]`
  std::string base;  ///< the `as` base name (`answer`), or the message name
  NodeKind kind = NodeKind::Message;
  std::string agent;       ///< `agent:` (for a private call without one: its owner); "" for none
  std::string private_to;  ///< the owner of a private message; "" when public
  std::vector<Edge> parents;
  std::optional<int64_t> new_offset;
  bool new_offset_dynamic = false;
  std::optional<std::string> text;    ///< message/prefill text when known (rendered, without role markers)
  bool conditional = false;           ///< the run may skip it (a `when`, or after an `until` that may stop)
  bool pml = false;                   ///< a PML message: at run time, the list of its pieces (docs/pml.md)
  std::optional<Text> model;          ///< calls: the `model:` it runs on (its own, else its agent's); none: default
  Retention retention;                ///< `pin`, `priority`, `ttl`, `release` (the KV tiers read them)
  std::optional<RepairPolicy> repair;  ///< calls: `repair:` (its own, else the workflow's); none: unset
  std::vector<Iteration> iterations;  ///< the enclosing `repeat` iterations, outermost first
  size_t batch = 0;                   ///< index into Plan::batches (= the step at which it runs)
  SourceLocation where;               ///< the call's key (`decode:`) or the message's name
};

/// One engine call: a prefill_batch or decode_batch; batches run one after another, so the index of a batch
/// is the step at which its nodes run.
struct Batch {
  NodeKind kind = NodeKind::Message;  ///< Message: the batch of declared messages, always step 0
  std::vector<size_t> nodes;
  bool conditional = false;  ///< every node in it is conditional
  SourceLocation where;
};

/// A `repeat` loop as unrolled: all iterations up to its maximum.
struct UnrolledLoop {
  std::string variable;
  int64_t iterations = 0;
  bool may_stop_early = false;  ///< `until` (or a `when` inside) reads generated text
  SourceLocation where;
};

/// The compiled workflow.
struct Plan {
  std::string workflow;  ///< its `name:`
  std::string file;
  std::vector<Node> nodes;  ///< in creation order (a parent always comes before its child)
  std::vector<Batch> batches;
  std::vector<UnrolledLoop> loops;
  std::vector<std::string> agents;  ///< declared agents, in file order
  std::vector<std::string> notes;   ///< things the check could not decide, for the user

  /// The number of prefill and decode calls (declared messages not counted).
  size_t call_count() const;
};

/// `--input k=v` and `--param k=v` as written; inputs not given are unknown rather than an error. `max_steps`
/// is the work bound (`--max-steps`, dsl/budget.h), spent as `choreo run` spends it.
struct Arguments {
  std::map<std::string, std::string> inputs;
  std::map<std::string, std::string> params;
  int64_t max_steps = kDefaultMaxSteps;
};

/// Compiles `workflow` to a plan. InputErrors (file:line:col): a fan-out or loop whose list depends on an
/// unknown input (hint: pass --input) or on generated text, an expression that fails, a parent that is not a
/// message, an unknown or mistyped `--input`/`--param`, passing the work bound. Shared values are never
/// expanded, so the work is linear in the size of the plan (nodes, edges, loop iterations).
Plan compile(const Workflow& workflow, const Arguments& arguments);

}  // namespace choreo::dsl::plan
