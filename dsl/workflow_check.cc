#include "dsl/workflow_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "dsl/workflow_parser.h"
#include "dsl/yaml_reader.h"

namespace choreo::dsl {

namespace {

enum class DefinitionKind { Input, Param, Message, Step, Let, Select };

std::string_view kind_name(DefinitionKind k) {
  switch (k) {
    case DefinitionKind::Input:
      return "an input";
    case DefinitionKind::Param:
      return "a parameter";
    case DefinitionKind::Message:
      return "a message";
    case DefinitionKind::Step:
      return "a step's `as` name";
    case DefinitionKind::Let:
      return "a `let` binding";
    case DefinitionKind::Select:
      return "a `select` name";
  }
  return "a name";
}

/// A name in the workflow's single namespace (inputs, params, messages and step-defined names).
struct Definition {
  DefinitionKind kind;
  SourceLocation where;
  std::string as_text;  // steps: the whole `as` text, to tell a duplicate from another slice of one list
  size_t index_count = 0;
};

std::string without_spaces(const std::string& s) {
  std::string out;
  for (char c : s)
    if (c != ' ' && c != '\t') out += c;
  return out;
}

bool mentions_word(const std::string& text, const std::string& word) {
  for (size_t i = text.find(word); i != std::string::npos; i = text.find(word, i + 1)) {
    bool starts = i == 0 || !is_identifier_char(text[i - 1]);
    bool ends = i + word.size() == text.size() || !is_identifier_char(text[i + word.size()]);
    if (starts && ends) return true;
  }
  return false;
}

class Checker {
 public:
  Checker(const Workflow& w, const SourceFile& file) : w_(w), file_(file) {}

  void run() {
    for (const Agent& a : w_.agents) {
      if (auto it = agents_.find(a.name.value); it != agents_.end()) {
        throw file_.error(a.name.where, fmt::format("agent `{}` is declared twice", a.name.value),
                          fmt::format("first declared at line {}", it->second.line));
      }
      agents_.emplace(a.name.value, a.name.where);
    }
    for (const Input& in : w_.inputs) define(in.name, DefinitionKind::Input);
    for (const Param& p : w_.params) define(p.name, DefinitionKind::Param);
    for (const Message& m : w_.messages) {
      define(m.name, DefinitionKind::Message);
      if (m.private_to) check_agent(*m.private_to, "private");
    }
    collect_later(w_.steps);
    walk(w_.steps, false);
  }

 private:
  const Workflow& w_;
  const SourceFile& file_;
  std::map<std::string, SourceLocation> agents_;
  std::map<std::string, Definition> defined_;
  std::map<std::string, SourceLocation> defined_by_steps_;  // every step-defined name, for "defined later"
  std::vector<std::string> loop_variables_;

  void collect_later(const std::vector<Step>& steps) {
    for (const Step& step : steps) {
      if (auto* c = std::get_if<Call>(&step.node))
        defined_by_steps_.emplace(c->as.base.value, c->as.base.where);
      if (auto* s = std::get_if<Select>(&step.node)) defined_by_steps_.emplace(s->as.value, s->as.where);
      if (auto* l = std::get_if<Let>(&step.node))
        for (const Binding& b : l->bindings) defined_by_steps_.emplace(b.name.value, b.name.where);
      if (auto* r = std::get_if<Repeat>(&step.node)) collect_later(r->steps);
    }
  }

  bool is_loop_variable(const std::string& name) const {
    return std::find(loop_variables_.begin(), loop_variables_.end(), name) != loop_variables_.end();
  }

  void define(const Text& name, DefinitionKind kind) {
    if (is_loop_variable(name.value)) {
      throw file_.error(name.where, fmt::format("`{}` is already a loop variable here", name.value),
                        "pick another name");
    }
    auto it = defined_.find(name.value);
    if (it != defined_.end()) {
      throw file_.error(name.where,
                        fmt::format("`{}` is already defined as {} (line {})", name.value,
                                    kind_name(it->second.kind), it->second.where.line),
                        "every input, parameter, message and step name must be unique");
    }
    defined_.emplace(name.value, Definition{kind, name.where, {}, 0});
  }

  void define_target(const Call& call) {
    const Target& t = call.as;
    if (call.for_each) {
      const std::string& variable = call.for_each->variable.value;
      bool indexed_by_variable = false;
      for (const Text& index : t.indices) indexed_by_variable |= mentions_word(index.value, variable);
      if (!indexed_by_variable) {
        throw file_.error(
            t.text.where,
            fmt::format("fan-out over `{}` writes `{}` in every branch", variable, t.text.value),
            fmt::format("index the name by the loop variable, e.g. `as: \"{}[{}]\"`", t.base.value,
                        variable));
      }
    }
    if (is_loop_variable(t.base.value)) {
      throw file_.error(t.base.where, fmt::format("`{}` is already a loop variable here", t.base.value));
    }
    auto it = defined_.find(t.base.value);
    if (it == defined_.end()) {
      defined_.emplace(t.base.value, Definition{DefinitionKind::Step, t.base.where,
                                                without_spaces(t.text.value), t.indices.size()});
      return;
    }
    const Definition& first = it->second;
    if (first.kind != DefinitionKind::Step) {
      throw file_.error(t.base.where,
                        fmt::format("`{}` is already defined as {} (line {})", t.base.value,
                                    kind_name(first.kind), first.where.line),
                        "every input, parameter, message and step name must be unique");
    }
    if (first.as_text == without_spaces(t.text.value)) {
      throw file_.error(t.text.where, fmt::format("duplicate `as` name `{}`", t.text.value),
                        fmt::format("it is already defined at line {}", first.where.line));
    }
    if (first.index_count != t.indices.size()) {
      throw file_.error(t.text.where,
                        fmt::format("`{}` has {} indices here but {} at line {}", t.base.value,
                                    t.indices.size(), first.index_count, first.where.line),
                        "one name is one list (or one message); use the same number of indices everywhere");
    }
  }

  std::vector<std::string> known_names() const {
    std::vector<std::string> out(loop_variables_);
    for (const auto& [name, definition] : defined_) out.push_back(name);
    return out;
  }

  /// Checks that a reference's leading name (when it names a message or a list of them) is defined already.
  void check_reference(const Text& ref, const std::string& base, ParentForm form, const Call* call,
                       bool in_repeat) {
    if (base.empty()) return;
    size_t after = base.size();
    while (after < ref.value.size() && ref.value[after] == ' ') ++after;
    if (after < ref.value.size() && ref.value[after] == '(')
      return;  // a function call: checked when compiled
    if (form == ParentForm::Comprehension) {
      for (const std::string& variable : comprehension_variables(ref.value)) {
        if (variable == base) return;
      }
    }
    if (is_loop_variable(base)) return;
    if (auto it = defined_.find(base); it != defined_.end()) {
      DefinitionKind kind = it->second.kind;
      if (kind == DefinitionKind::Input || kind == DefinitionKind::Param) {
        throw file_.error(ref.where, fmt::format("`{}` is {}, not a message", base, kind_name(kind)),
                          "parents are messages: names under `messages:` or `as:` names of earlier steps");
      }
      return;
    }
    if (call && base == call->as.base.value) {
      if (in_repeat && form != ParentForm::Name) return;  // an earlier iteration's message
      throw file_.error(ref.where, fmt::format("`{}` cannot be a parent of the call that defines it", base),
                        in_repeat ? "index an earlier iteration, e.g. `" + base + "[r-1]`"
                                  : "a call only sees messages defined before it");
    }
    if (auto later = defined_by_steps_.find(base); later != defined_by_steps_.end()) {
      throw file_.error(
          ref.where, fmt::format("`{}` is defined later (line {})", base, later->second.line),
          "a step can only use messages defined before it, which keeps workflows free of cycles");
    }
    std::vector<std::string> names = known_names();
    std::string hint = did_you_mean(base, names);
    throw file_.error(ref.where, fmt::format("unknown name `{}`", base),
                      hint.empty()
                          ? "parents name messages declared under `messages:` or `as:` names of earlier steps"
                          : hint);
  }

  void check_agent(const Text& name, std::string_view key) {
    if (name.value.find("{{") != std::string::npos) return;  // a template: resolved at run time
    if (agents_.count(name.value)) return;
    if (agents_.empty()) {
      throw file_.error(name.where,
                        fmt::format("`{}: {}` names an agent, but no agents are declared", key, name.value),
                        fmt::format("declare it at the top level: `agents: [{}]`", name.value));
    }
    std::vector<std::string> names;
    for (const auto& [agent, where] : agents_) names.push_back(agent);
    std::string hint = did_you_mean(name.value, names);
    throw file_.error(name.where, fmt::format("unknown agent `{}`", name.value),
                      hint.empty() ? fmt::format("declared agents: {}", fmt::join(names, ", ")) : hint);
  }

  void push_loop(const Loop& loop) {
    const Text& v = loop.variable;
    if (is_loop_variable(v.value)) {
      throw file_.error(v.where,
                        fmt::format("loop variable `{}` is already used by an enclosing loop", v.value));
    }
    if (auto it = defined_.find(v.value); it != defined_.end()) {
      throw file_.error(v.where,
                        fmt::format("loop variable `{}` hides {} (line {})", v.value,
                                    kind_name(it->second.kind), it->second.where.line),
                        "pick another loop variable name");
    }
    loop_variables_.push_back(v.value);
  }

  void walk_call(const Call& c, bool in_repeat) {
    if (c.for_each) push_loop(*c.for_each);
    for (const Parent& p : c.parents) check_reference(p.ref, p.base, p.form, &c, in_repeat);
    if (c.message) {
      auto it = defined_.find(c.message->value);
      if (it == defined_.end() || it->second.kind != DefinitionKind::Message) {
        std::vector<std::string> names;
        for (const Message& m : w_.messages) names.push_back(m.name.value);
        std::string hint = did_you_mean(c.message->value, names);
        throw file_.error(c.message->where,
                          fmt::format("`message: {}` is not a declared message", c.message->value),
                          hint.empty() ? "`message:` names an entry of the top-level `messages:`" : hint);
      }
    }
    if (c.agent) check_agent(*c.agent, "agent");
    if (c.private_to) check_agent(*c.private_to, "private");
    define_target(c);
    if (c.for_each) loop_variables_.pop_back();
  }

  void walk(const std::vector<Step>& steps, bool in_repeat) {
    for (const Step& step : steps) {
      if (auto* c = std::get_if<Call>(&step.node)) {
        walk_call(*c, in_repeat);
      } else if (auto* l = std::get_if<Let>(&step.node)) {
        for (const Binding& b : l->bindings) define(b.name, DefinitionKind::Let);
      } else if (auto* s = std::get_if<Select>(&step.node)) {
        size_t i = 0;
        while (i < s->choice.value.size() &&
               (std::isalnum(static_cast<unsigned char>(s->choice.value[i])) || s->choice.value[i] == '_')) {
          ++i;
        }
        std::string base = s->choice.value.substr(0, i);
        if (is_identifier(base)) {
          check_reference(s->choice, base, ParentForm::Indexed, nullptr, in_repeat);
        }
        define(s->as, DefinitionKind::Select);
      } else if (auto* r = std::get_if<Repeat>(&step.node)) {
        push_loop(r->loop);
        walk(r->steps, true);
        loop_variables_.pop_back();
      }
    }
  }
};

}  // namespace

void check_workflow(const Workflow& workflow, const SourceFile& file) { Checker(workflow, file).run(); }

}  // namespace choreo::dsl
