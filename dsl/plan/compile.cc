// Compiles a workflow to a Plan: the elaborator (elaborate.h) with what only a run knows left unknown, and
// an executor that records each batch as plan nodes. A node's message is bound with its text when the text
// is known (declared messages, prefills of known templates) and without it for decodes, so expressions that
// read generated text stay unevaluated.

#include <algorithm>

#include "dsl/plan/elaborate.h"
#include "dsl/plan/plan.h"

namespace choreo::dsl::plan {

const char* kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::Message:
      return "message";
    case NodeKind::Prefill:
      return "prefill";
    case NodeKind::Decode:
      return "decode";
  }
  return "?";
}

size_t Plan::call_count() const {
  return size_t(
      std::count_if(nodes.begin(), nodes.end(), [](const Node& n) { return n.kind != NodeKind::Message; }));
}

namespace {

/// Records batches as plan nodes; a node's message id is its index in Plan::nodes.
class Recorder : public Executor {
 public:
  explicit Recorder(Plan& plan) : plan_(plan) {}

  std::vector<expr::Value> execute(NodeKind kind, std::vector<Branch>& branches,
                                   const SourceLocation& where) override {
    Batch batch{kind, {}, kind != NodeKind::Message, where};
    std::vector<expr::Value> values;
    for (Branch& b : branches) {
      const size_t id = plan_.nodes.size();
      b.node.batch = plan_.batches.size();
      b.node.pml = kind == NodeKind::Message && b.message && b.message->prompt;
      batch.nodes.push_back(id);
      batch.conditional = batch.conditional && b.node.conditional;
      values.push_back(expr::Value::message({id, b.node.text.value_or(""), b.node.text.has_value()}));
      plan_.nodes.push_back(std::move(b.node));
    }
    plan_.batches.push_back(std::move(batch));
    return values;
  }

 private:
  Plan& plan_;
};

}  // namespace

Plan compile(const Workflow& workflow, const Arguments& arguments) {
  Plan plan;
  plan.workflow = workflow.name.value;
  plan.file = workflow.file;
  for (const Agent& a : workflow.agents) plan.agents.push_back(a.name.value);
  Recorder recorder(plan);
  Elaboration e = elaborate(workflow, arguments, recorder, Knowledge::Partial);
  plan.loops = std::move(e.loops);
  plan.notes = std::move(e.notes);
  return plan;
}

}  // namespace choreo::dsl::plan
