// The elaborator (elaborate.h): one walk over a workflow's steps that serves both `choreo check` (values
// only the run knows stay unknown) and `choreo run` (every value is known). An expression is evaluated when
// dependence.h says it needs nothing unknown; otherwise its outcome is kept open: a condition makes what it
// guards conditional, a choice of message becomes every message it could pick, and a count (a fan-out, a
// loop, an `as` index) is an error.

#include "dsl/plan/elaborate.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "dsl/arguments.h"
#include "dsl/budget.h"
#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/source.h"
#include "dsl/expr/template.h"
#include "dsl/plan/dependence.h"

namespace choreo::dsl::plan {

namespace {

using expr::Assignment;
using expr::MapScope;
using expr::Scope;
using expr::Type;
using expr::Value;

/// The largest index an `as` target may write (keeps a typo like `a[10**9]` from allocating a huge list).
constexpr int64_t kMaxTargetIndex = 100'000;

/// The largest explicit position (`at:`, `new_offset:`).
constexpr int64_t kMaxPosition = 1'000'000'000;

/// Why a value is not known before the run.
struct Unknown {
  std::string reason;  ///< e.g. "input `problem`, which has no value" or "the generated text of a decode"
  std::string missing_input;  ///< set when an input without a value is the root cause
};

/// A global name: a known value, or one only the run computes (with the messages it could hold).
struct Slot {
  std::optional<Value> value;
  Unknown unknown;
  Shape shape;                     ///< unknown values: where messages may sit in it
  std::vector<size_t> candidates;  ///< unknown values: every message it could hold
};

/// Inputs, params and the names steps bind; unknown names are invisible to evaluation (it never sees them).
class GlobalScope : public Scope {
 public:
  std::optional<Value> lookup(std::string_view name) const override {
    auto it = bindings_.find(name);
    if (it == bindings_.end()) return std::nullopt;
    return it->second.value;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, binding] : bindings_) out.push_back(name);
    return out;
  }
  const Slot* find(std::string_view name) const {
    auto it = bindings_.find(name);
    return it == bindings_.end() ? nullptr : &it->second;
  }
  void set(const std::string& name, Slot binding) { bindings_[name] = std::move(binding); }
  /// The known value bound to `name` (null when none), moved out so that changing it need not copy it.
  Value take(std::string_view name) {
    auto it = bindings_.find(name);
    return it == bindings_.end() || !it->second.value ? Value() : std::move(*it->second.value);
  }

 private:
  std::map<std::string, Slot, std::less<>> bindings_;
};

/// Appends every message in a value (at any depth), in order; false if something else is in it.
bool flatten_messages(const Value& value, std::vector<size_t>& out) {
  if (value.type() == Type::Message) {
    out.push_back(size_t(value.as_message().id));
    return true;
  }
  if (value.type() != Type::List) return false;
  bool ok = true;
  for (const Value& item : value.as_list()) ok = flatten_messages(item, out) && ok;
  return ok;
}

/// Every message anywhere in a value (lists and dicts), for over-approximating a run-time choice. A list or
/// dict shared several times inside the value is walked once (`seen`), so the work is the value's size in
/// memory, not its size written out.
void collect_messages(const Value& value, std::set<size_t>& out, std::set<const void*>& seen) {
  if (value.type() == Type::Message) {
    out.insert(size_t(value.as_message().id));
    return;
  }
  if (value.summary().message_depths == 0 || !seen.insert(value.identity()).second) return;
  if (value.type() == Type::List)
    for (const Value& item : value.as_list()) collect_messages(item, out, seen);
  if (value.type() == Type::Dict)
    for (const auto& [key, item] : value.as_dict()) collect_messages(item, out, seen);
}

void collect_messages(const Value& value, std::set<size_t>& out) {
  std::set<const void*> seen;
  collect_messages(value, out, seen);
}

}  // namespace

std::map<std::string, std::optional<expr::Value>, std::less<>> bind_arguments(const Workflow& w,
                                                                             const Arguments& arguments,
                                                                             Knowledge knowledge) {
  std::map<std::string, std::optional<Value>, std::less<>> out;
  std::set<std::string> fields;
  for (const Message& m : w.messages)
    if (m.field) fields.insert(m.field->value);
  std::vector<std::string> input_names;
  for (const Input& input : w.inputs) input_names.push_back(input.name.value);
  for (const auto& [key, text] : arguments.inputs) {
    if (std::find(input_names.begin(), input_names.end(), key) != input_names.end()) continue;
    if (fields.count(key)) {
      out[key] = Value::string(text);
      continue;
    }
    std::vector<std::string> candidates = input_names;
    candidates.insert(candidates.end(), fields.begin(), fields.end());
    throw InputError(expr::with_suggestion(fmt::format("unknown input `{}`", key), key, candidates),
                     candidates.empty() ? "this workflow declares no inputs"
                                        : fmt::format("the inputs are: {}", fmt::join(candidates, ", ")));
  }
  for (const Input& input : w.inputs) {
    const std::string& name = input.name.value;
    auto given = arguments.inputs.find(name);
    if (given != arguments.inputs.end())
      out[name] = dsl::convert_argument(given->second, input.type, fmt::format("input `{}`", name));
    else if (knowledge == Knowledge::Complete)
      throw InputError(fmt::format("input `{}` has no value", name),
                       fmt::format("pass --input {}=VALUE ({})", name, dsl::value_type_name(input.type)),
                       input.where, w.source_line(input.where.line));
    else
      out[name] = std::nullopt;
  }
  std::vector<std::string> param_names;
  for (const Param& p : w.params) param_names.push_back(p.name.value);
  for (const auto& [key, text] : arguments.params)
    if (std::find(param_names.begin(), param_names.end(), key) == param_names.end())
      throw InputError(expr::with_suggestion(fmt::format("unknown param `{}`", key), key, param_names),
                       param_names.empty() ? "this workflow declares no params"
                                           : fmt::format("the params are: {}", fmt::join(param_names, ", ")));
  for (const Param& p : w.params) {
    auto given = arguments.params.find(p.name.value);
    out[p.name.value] =
        given == arguments.params.end()
            ? dsl::literal_value(p.value)
            : dsl::convert_argument(given->second, p.value.type, fmt::format("param `{}`", p.name.value));
  }
  return out;
}

namespace {

class Elaborator {
 public:
  Elaborator(const Workflow& workflow, const Arguments& arguments, Executor& executor, Knowledge knowledge)
      : w_(workflow), arguments_(arguments), executor_(executor), knowledge_(knowledge),
        budget_(workflow, arguments.max_steps), pml_(workflow) {
    for (const Agent& a : w_.agents) agents_.push_back(a.name.value);
    for (const Agent& a : w_.agents)
      if (a.model) check_model(*a.model);
  }

  Elaboration run() {
    bind_arguments();
    messages();
    steps(w_.steps, globals_);
    if (w_.output) out_.output = render(*w_.output, globals_);
    return std::move(out_);
  }

 private:
  const Workflow& w_;
  const Arguments& arguments_;
  Executor& executor_;
  Knowledge knowledge_;
  WorkBudget budget_;
  PmlLoader pml_;  // PML messages' schemas, loaded as the plan is made
  Elaboration out_;
  GlobalScope globals_;
  std::vector<std::string> agents_;    // declared agents, in file order
  bool conditional_ = false;           // the steps being elaborated may not run
  std::vector<Iteration> iterations_;  // enclosing repeat iterations

  InputError error_at(const SourceLocation& where, std::string message, std::string hint = {}) const {
    return InputError(std::move(message), std::move(hint), where, w_.source_line(where.line));
  }

  // ---- inputs and params -----------------------------------------------------------------------------

  void bind_arguments() {
    for (auto& [name, value] : plan::bind_arguments(w_, arguments_, knowledge_)) {
      Slot b;
      if (value)
        b.value = std::move(*value);
      else
        b.unknown = {fmt::format("input `{}`, which has no value", name), name};
      globals_.set(name, std::move(b));
    }
  }

  // ---- what is known -----------------------------------------------------------------------------------

  Shape name_shape(std::string_view name, const Scope& scope) const {
    if (std::optional<Value> v = scope.lookup(name)) return shape_of(*v);
    if (const Slot* b = globals_.find(name)) return b->shape;
    return {};
  }

  Dependence dependence(const expr::Expr& e, const Scope& scope) const {
    return analyze(e, [&](std::string_view name) { return name_shape(name, scope); });
  }

  /// Why `e` cannot be evaluated before the run, or nullopt when it can.
  std::optional<Unknown> unknown_of(const expr::Expr& e, const Scope& scope) const {
    std::optional<Unknown> out;
    for (const expr::Name& n : expr::free_names(e)) {
      if (scope.lookup(n.name)) continue;
      const Slot* b = globals_.find(n.name);
      if (b && !b->value) {
        out = b->unknown;
        break;
      }
    }
    if (!out && dependence(e, scope).reads_generated_text) out = Unknown{"the generated text of a decode", {}};
    // A run knows every value: an unknown one there is a bug in the executor, not in the workflow.
    if (out && knowledge_ == Knowledge::Complete)
      throw std::logic_error(fmt::format("internal error: a run does not know the value of `{}` ({})",
                                         e.text(), out->reason));
    return out;
  }

  /// Every message a run-time value of `e` could hold (empty when its value can hold none).
  std::vector<size_t> candidates_of(const expr::Expr& e, const Scope& scope) const {
    if (dependence(e, scope).result.messages == 0) return {};
    std::set<size_t> out;
    for (const expr::Name& n : expr::free_names(e)) {
      if (std::optional<Value> v = scope.lookup(n.name)) {
        collect_messages(*v, out);
      } else if (const Slot* b = globals_.find(n.name)) {
        out.insert(b->candidates.begin(), b->candidates.end());
      }
    }
    return {out.begin(), out.end()};
  }

  expr::Expr parse(const Text& text) const { return expr::parse_expression(text.value, text.where); }

  /// A condition: its value when known before the run, nullopt when only the run decides.
  std::optional<bool> condition(const Text& text, const Scope& scope) const {
    const expr::Expr e = parse(text);
    if (unknown_of(e, scope)) return std::nullopt;
    return expr::evaluate_condition(e, scope);
  }

  /// A template's text when known before the run.
  std::optional<std::string> render(const Text& text, const Scope& scope) const {
    const expr::Template t = expr::parse_template(text.value, text.where);
    for (const expr::TemplatePart& part : t.parts)
      if (part.expression && unknown_of(*part.expression, scope)) return std::nullopt;
    return expr::render(t, scope);
  }

  /// A value the plan's shape depends on (a loop's list, an `as` index): unknown is an error.
  Value required(const Text& text, const Scope& scope, std::string_view what) const {
    const expr::Expr e = parse(text);
    if (std::optional<Unknown> u = unknown_of(e, scope)) {
      throw error_at(
          text.where, fmt::format("cannot expand {}: it depends on {}", what, u->reason),
          u->missing_input.empty()
              ? "counts and names must be known before the run (use params, inputs and loop "
                "variables, not generated text)"
              : fmt::format("pass --input {}=VALUE so `choreo check` can expand it", u->missing_input));
    }
    return expr::evaluate(e, scope);
  }

  /// The elements a `NAME in EXPR` header iterates over: a list, or a dict's keys (sorted).
  std::vector<Value> iterate(const dsl::Loop& loop, const Scope& scope, std::string_view what) const {
    const Value v = required(loop.iterable, scope, what);
    if (v.type() == Type::List) return v.as_list();
    if (v.type() == Type::Dict) {
      std::vector<Value> keys;
      for (const auto& [key, item] : v.as_dict()) keys.push_back(Value::string(key));
      return keys;
    }
    throw error_at(
        loop.iterable.where,
        fmt::format("a loop needs a list to iterate over, got {} {}", v.type_name(), expr::describe(v)),
        "write e.g. `i in range(3)`");
  }

  /// An integer setting when known, checked for type and range.
  std::optional<int64_t> integer(const IntSetting& s, const Scope& scope, std::string_view what, int64_t low,
                                 int64_t high) const {
    int64_t v = 0;
    if (const int64_t* literal = std::get_if<int64_t>(&s.value)) {
      v = *literal;
    } else {
      const expr::Expr e = parse(std::get<Text>(s.value));
      if (unknown_of(e, scope)) return std::nullopt;
      const Value value = expr::evaluate(e, scope);
      if (value.type() != Type::Int)
        throw error_at(s.where, fmt::format("`{}` must be a whole number, got {} {}", what, value.type_name(),
                                            expr::describe(value)));
      v = value.as_int();
    }
    if (v < low || v > high)
      throw error_at(s.where, fmt::format("`{}` must be in [{}, {}], got {}", what, low, high, v));
    return v;
  }

  /// A real setting when known: ≥ 0, or a probability in (0, 1].
  std::optional<double> real(const FloatSetting& s, const Scope& scope, std::string_view what,
                             bool probability) const {
    double v = 0;
    if (const double* literal = std::get_if<double>(&s.value)) {
      v = *literal;
    } else {
      const expr::Expr e = parse(std::get<Text>(s.value));
      if (unknown_of(e, scope)) return std::nullopt;
      const Value value = expr::evaluate(e, scope);
      if (!value.is_number())
        throw error_at(s.where, fmt::format("`{}` must be a number, got {} {}", what, value.type_name(),
                                            expr::describe(value)));
      v = value.as_number();
    }
    const bool ok = probability ? (v > 0 && v <= 1) : v >= 0;
    if (!ok)
      throw error_at(s.where,
                     fmt::format("`{}` must be {}, got {}", what, probability ? "in (0, 1]" : "≥ 0", v));
    return v;
  }

  /// The workflow's sampling settings, overridden by the call's, field by field.
  SamplingValues sampling(const Scope& scope, const Sampling& call) const {
    SamplingValues out;
    auto set = [&out](auto& field, auto value) {
      field = value;
      if (!value) out.complete = false;
    };
    for (const Sampling* s : {&w_.sampling, &call}) {
      if (s->temperature) set(out.temperature, real(*s->temperature, scope, "temperature", false));
      if (s->top_p) set(out.top_p, real(*s->top_p, scope, "top_p", true));
      if (s->top_k) set(out.top_k, integer(*s->top_k, scope, "top_k", INT64_MIN, INT64_MAX));
      if (s->max_tokens) set(out.max_tokens, integer(*s->max_tokens, scope, "max_tokens", 1, 1'000'000));
      if (s->seed) set(out.seed, integer(*s->seed, scope, "seed", 0, INT64_MAX));
      if (s->stop) {
        std::vector<std::string> stops;
        bool known = true;
        for (const Text& stop : *s->stop) {
          std::optional<std::string> text = render(stop, scope);
          known = known && text.has_value();
          if (text) stops.push_back(std::move(*text));
        }
        out.stop = known ? std::optional(std::move(stops)) : std::nullopt;
        out.complete = out.complete && known;
      }
    }
    return out;
  }

  /// An `agent:`/`private:` template: a declared agent (when any are declared); "?" when only the run knows.
  std::string agent(const Text& text, const Scope& scope, const std::string& call) {
    std::optional<std::string> name = render(text, scope);
    if (!name) {
      out_.notes.push_back(
          fmt::format("{}: the agent of `{}` is known only at run time; the check treats it "
                      "as an agent that owns nothing",
                      text.where.to_string(), call));
      return "?";
    }
    if (agents_.empty() || std::find(agents_.begin(), agents_.end(), *name) != agents_.end()) return *name;
    throw error_at(text.where, expr::with_suggestion(fmt::format("unknown agent `{}`", *name), *name, agents_),
                   fmt::format("the agents are: {}", fmt::join(agents_, ", ")));
  }

  /// A `model:` name: one declared under `models:`, or `default` (the run's model).
  void check_model(const Text& name) const {
    std::vector<std::string> names{"default"};
    for (const ModelDecl& m : w_.models) names.push_back(m.name.value);
    if (std::find(names.begin(), names.end(), name.value) != names.end()) return;
    throw error_at(name.where,
                   expr::with_suggestion(fmt::format("unknown model `{}`", name.value), name.value, names),
                   w_.models.empty()
                       ? "declare it under `models:` (`NAME: FILE.gguf`, or `NAME: {file: ..., lora: ...}`)"
                       : fmt::format("the models are: {}", fmt::join(names, ", ")));
  }

  // ---- batches -----------------------------------------------------------------------------------------

  /// Sends a batch to the executor and binds each branch's name to the value it returns: every branch of a
  /// batch at once, so that a fan-out of n branches copies its list once, not n times.
  void execute(NodeKind kind, std::vector<Branch>& branches, const SourceLocation& where) {
    if (branches.empty()) return;
    std::vector<std::pair<std::string, std::vector<int64_t>>> targets;  // the executor may move the branches
    for (const Branch& b : branches) targets.emplace_back(b.node.base, b.indices);
    std::vector<Value> values = executor_.execute(kind, branches, where);
    std::map<std::string, std::vector<Assignment>> by_base;
    for (size_t i = 0; i < targets.size(); ++i)
      by_base[targets[i].first].push_back({std::move(targets[i].second), std::move(values.at(i))});
    for (auto& [base, assignments] : by_base) {
      try {
        globals_.set(base, Slot{expr::assign_all(globals_.take(base), assignments), {}, {}, {}});
      } catch (const expr::ValueLimitError& e) {
        throw error_at(where, fmt::format("binding `{}`: {}", base, e.message()), e.hint());
      }
    }
  }

  /// The text of a declared message with `text:` or `field:` (nullopt when only the run knows it); a PML
  /// message has none of its own.
  std::optional<std::string> message_text(const Message& m, const Scope& scope) const {
    if (m.text) return render(*m.text, scope);
    if (m.field) {
      std::optional<Value> v = scope.lookup(m.field->value);
      if (!v) {
        if (knowledge_ == Knowledge::Partial) return std::nullopt;
        throw error_at(
            m.field->where,
            fmt::format("dataset field `{}` has no value (datasets are not supported yet)", m.field->value),
            fmt::format("pass it with --input {}=TEXT", m.field->value));
      }
      try {
        return expr::render_within(*v, expr::EvalLimits{}.max_string_bytes);
      } catch (const expr::ValueLimitError& e) {
        throw error_at(m.field->where, fmt::format("field `{}`: {}", m.field->value, e.message()), e.hint());
      }
    }
    throw error_at(m.where, fmt::format("message `{}` is a PML prompt; it cannot be prefilled again", m.name.value),
                   fmt::format("list `{}` as a parent instead", m.name.value));
  }

  void messages() {
    std::vector<Branch> branches;
    for (const Message& m : w_.messages) {
      Branch b;
      b.node.name = b.node.base = m.name.value;
      b.node.kind = NodeKind::Message;
      b.node.where = m.name.where;
      b.role = m.role;
      b.message = &m;
      b.node.retention = m.retention;
      if (m.private_to) b.node.agent = b.node.private_to = agent(*m.private_to, globals_, m.name.value);
      if (m.prompt) {
        out_.notes.push_back(
            fmt::format("{}: message `{}` is a PML prompt; the plan shows it as one message (its modules and "
                        "uncached parts are separate messages at run time)",
                        m.where.to_string(), m.name.value));
        b.pml_file = render(*m.pml, globals_);
        b.pml_prompt = render(*m.prompt, globals_);
        if (b.pml_file && b.pml_prompt) b.pml = pml_.load(m, *b.pml_file, *b.pml_prompt);
      } else {
        b.node.text = message_text(m, globals_);
        if (b.node.text && b.node.text->empty() && m.role == Role::None)
          throw error_at(m.where, fmt::format("message `{}` is empty", m.name.value));
      }
      branches.push_back(std::move(b));
    }
    if (!branches.empty()) execute(NodeKind::Message, branches, w_.messages.front().where);
  }

  void add_parents(Node& node, const Parent& parent, const Scope& scope) const {
    const expr::Expr e = parse(parent.ref);
    std::optional<int64_t> at;
    bool at_dynamic = false;
    if (parent.at) {
      at = integer(*parent.at, scope, "at", 0, kMaxPosition);
      at_dynamic = !at;
    }
    std::vector<size_t> ids;
    bool selection = false;
    if (unknown_of(e, scope)) {
      ids = candidates_of(e, scope);
      selection = true;
      if (ids.empty())
        throw error_at(
            parent.ref.where, fmt::format("parent `{}` can never be a message", parent.ref.value),
            "parents name messages: declared messages, `as` names of earlier calls, or `select` names");
    } else {
      const Value v = expr::evaluate(e, scope);
      if (!flatten_messages(v, ids))
        throw error_at(
            parent.ref.where,
            fmt::format("parent `{}` is {} {}, not a message or a list of messages", parent.ref.value,
                        v.type_name(), expr::describe(v)),
            "parents name messages: declared messages, `as` names of earlier calls, or `select` names");
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      Edge edge;
      edge.parent = ids[i];
      // An explicit offset places the first message (every candidate, for a selection); the rest follow.
      if (i == 0 || selection) {
        edge.at = at;
        edge.at_dynamic = at_dynamic;
      }
      edge.selection = selection;
      edge.where = parent.ref.where;
      node.parents.push_back(edge);
    }
  }

  /// Evaluates everything one branch of a call needs: its name, parents, text or header, and settings.
  Branch prepare(const Call& call, const Scope& scope, bool conditional) {
    Branch b;
    Node& n = b.node;
    n.kind = call.kind == CallKind::Prefill ? NodeKind::Prefill : NodeKind::Decode;
    n.base = n.name = call.as.base.value;
    n.where = call.where;
    n.conditional = conditional;
    n.iterations = iterations_;
    for (const Text& index : call.as.indices) {
      const Value v = required(index, scope, fmt::format("the name `{}`", call.as.text.value));
      if (v.type() != Type::Int || v.as_int() < 0 || v.as_int() > kMaxTargetIndex)
        throw error_at(index.where, fmt::format("an `as` index must be a whole number in [0, {}], got {}",
                                                kMaxTargetIndex, expr::describe(v)));
      b.indices.push_back(v.as_int());
      n.name += fmt::format("[{}]", v.as_int());
    }
    for (const Parent& parent : call.parents) add_parents(n, parent, scope);
    n.retention = call.retention;
    if (call.repair)
      n.repair = call.repair->policy;
    else if (w_.repair)
      n.repair = w_.repair->policy;
    if (call.new_offset) {
      n.new_offset = integer(*call.new_offset, scope, "new_offset", 0, kMaxPosition);
      n.new_offset_dynamic = !n.new_offset;
    }
    if (call.agent) n.agent = agent(*call.agent, scope, n.name);
    if (call.private_to) {
      n.private_to = agent(*call.private_to, scope, n.name);
      if (n.agent.empty()) n.agent = n.private_to;
    } else if (!n.agent.empty()) {
      // An agent declared `private: true` keeps what its calls make to itself.
      for (const Agent& a : w_.agents)
        if (a.private_default && a.name.value == n.agent) n.private_to = n.agent;
    }
    // The call's own `model:`, else its agent's.
    if (call.model) {
      check_model(*call.model);
      n.model = call.model;
    } else {
      for (const Agent& a : w_.agents)
        if (a.model && a.name.value == n.agent) n.model = a.model;
    }
    if (call.message)
      for (const Message& m : w_.messages)
        if (m.name.value == call.message->value) b.message = &m;
    b.role = call.role != Role::None || !b.message ? call.role : b.message->role;
    if (n.kind == NodeKind::Prefill) {
      if (b.message)
        n.text = message_text(*b.message, scope);
      else if (call.text)
        n.text = render(*call.text, scope);
      else
        n.text = std::string();
      if (n.text && n.text->empty() && b.role == Role::None)
        throw error_at(call.where, fmt::format("prefill `{}` has no tokens", n.name));
    } else {
      b.header = call.header ? render(*call.header, scope) : std::string();
      if (b.header && b.header->empty() && b.role == Role::None)
        throw error_at(call.where, fmt::format("decode `{}` has an empty header", n.name),
                       "give a non-empty `header:` or a `role:`");
      b.sampling = sampling(scope, call.sampling);
    }
    return b;
  }

  // ---- steps -------------------------------------------------------------------------------------------

  void steps(const std::vector<Step>& list, const Scope& scope) {
    for (const Step& step : list) std::visit([&](const auto& node) { this->step(node, scope); }, step.node);
  }

  /// A binding that may or may not happen (a `let`/`select` under a condition only the run decides): the
  /// name may keep its old value or take the new one.
  Slot maybe(const std::string& name, Slot next) const {
    const Slot* old = globals_.find(name);
    if (!old) return next;
    Slot out;
    out.unknown = next.value ? old->unknown : next.unknown;
    if (out.unknown.reason.empty()) out.unknown = {"a `when` that reads generated text", {}};
    std::set<size_t> candidates(next.candidates.begin(), next.candidates.end());
    candidates.insert(old->candidates.begin(), old->candidates.end());
    out.shape = next.shape;
    out.shape |= old->shape;
    for (const Slot* b : std::initializer_list<const Slot*>{old, &next}) {
      if (!b->value) continue;
      collect_messages(*b->value, candidates);
      out.shape |= shape_of(*b->value);
    }
    out.candidates.assign(candidates.begin(), candidates.end());
    return out;
  }

  /// The binding of an expression's value: known, or unknown with the messages it could hold.
  Slot binding_of(const Text& text, const Scope& scope) const {
    const expr::Expr e = parse(text);
    Slot b;
    if (std::optional<Unknown> u = unknown_of(e, scope)) {
      b.unknown = *u;
      b.shape = dependence(e, scope).result;
      b.candidates = candidates_of(e, scope);
    } else {
      b.value = expr::evaluate(e, scope);
    }
    return b;
  }

  void step(const Let& let, const Scope& scope) {
    std::optional<bool> when = let.when ? condition(*let.when, scope) : std::optional<bool>(true);
    if (when && !*when) return;
    for (const dsl::Binding& binding : let.bindings) {
      Slot b = binding_of(binding.value, scope);
      globals_.set(binding.name.value, when ? std::move(b) : maybe(binding.name.value, std::move(b)));
    }
  }

  void step(const Select& select, const Scope& scope) {
    std::optional<bool> when = select.when ? condition(*select.when, scope) : std::optional<bool>(true);
    if (when && !*when) return;
    Slot b = binding_of(select.choice, scope);
    if (b.value) {
      std::vector<size_t> ids;
      if (!flatten_messages(*b.value, ids) || ids.empty())
        throw error_at(select.choice.where, fmt::format("`select` must pick a message, got {} {}",
                                                        b.value->type_name(), expr::describe(*b.value)));
    } else if (b.candidates.empty()) {
      throw error_at(select.choice.where,
                     fmt::format("`select: {}` can never pick a message", select.choice.value),
                     "select names a message, e.g. `cot[best]`");
    }
    globals_.set(select.as.value, when ? std::move(b) : maybe(select.as.value, std::move(b)));
  }

  void step(const Repeat& repeat, const Scope& scope) {
    std::optional<bool> when = repeat.when ? condition(*repeat.when, scope) : std::optional<bool>(true);
    if (when && !*when) return;
    const bool outer_conditional = conditional_;
    conditional_ = conditional_ || !when;
    const std::vector<Value> elements = iterate(repeat.loop, scope, "this `repeat`");
    const size_t loop = out_.loops.size();
    out_.loops.push_back({repeat.loop.variable.value, 0, false, repeat.where});
    for (size_t k = 0; k < elements.size(); ++k) {
      budget_.iteration(repeat.loop);
      MapScope inner(&scope);
      inner.set(repeat.loop.variable.value, elements[k]);
      iterations_.push_back({loop, int64_t(k)});
      out_.loops[loop].iterations = int64_t(k) + 1;
      steps(repeat.steps, inner);
      iterations_.pop_back();
      if (!repeat.until) continue;
      std::optional<bool> stop = condition(*repeat.until, inner);
      if (stop && *stop) break;
      if (!stop) {
        // The run may stop here: every later iteration is conditional.
        out_.loops[loop].may_stop_early = true;
        conditional_ = true;
      }
    }
    conditional_ = outer_conditional;
  }

  void step(const Call& call, const Scope& scope) {
    std::vector<Branch> branches;
    if (call.for_each) {
      const std::vector<Value> elements = iterate(*call.for_each, scope, "this `for`");
      for (const Value& element : elements) {
        budget_.iteration(*call.for_each);
        MapScope inner(&scope);
        inner.set(call.for_each->variable.value, element);
        try {
          std::optional<bool> when = call.when ? condition(*call.when, inner) : std::optional<bool>(true);
          if (when && !*when) continue;
          branches.push_back(prepare(call, inner, conditional_ || !when));
        } catch (const InputError& e) {
          throw e.with_message(fmt::format("in branch {} = {}: {}", call.for_each->variable.value,
                                           expr::describe(element), e.message()));
        }
      }
    } else {
      budget_.call(call);
      std::optional<bool> when = call.when ? condition(*call.when, scope) : std::optional<bool>(true);
      if (when && !*when) return;
      branches.push_back(prepare(call, scope, conditional_ || !when));
    }
    execute(call.kind == CallKind::Prefill ? NodeKind::Prefill : NodeKind::Decode, branches, call.where);
  }
};

}  // namespace

Elaboration elaborate(const Workflow& workflow, const Arguments& arguments, Executor& executor,
                      Knowledge knowledge) {
  return Elaborator(workflow, arguments, executor, knowledge).run();
}

}  // namespace choreo::dsl::plan
