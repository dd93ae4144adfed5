#include "dsl/workflow_parser.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/input_file.h"
#include "dsl/expr/value.h"
#include "dsl/workflow_check.h"
#include "dsl/yaml_errors.h"
#include "dsl/yaml_reader.h"

namespace choreo::dsl {

namespace {

using YAML::Node;
using Keys = std::vector<std::string>;
using Entry = YamlEntry;
using Entries = YamlMap;

std::string kind_name(const Node& n) { return yaml_kind_name(n); }

/// Hints for keys that are valid elsewhere (`until` on a call, `if` for `when`) and that edit distance
/// misses.
std::string misplaced_key_hint(const std::string& key, std::string_view context) {
  if (key == "if") return "conditions are written `when: EXPR`";
  if (key == "until") return "`until:` belongs next to `repeat:` (an early stop for the loop)";
  if (key == "sampling" && context == "decode") {
    return "write sampling overrides directly in the decode map, e.g. `temperature: 0.2`";
  }
  if (key == "text" && context == "decode") {
    return "decode generates its text; `header:` gives the fixed start of the reply";
  }
  if (key == "header" && context == "prefill") return "`header:` belongs to decode; prefill encodes `text:`";
  if ((key == "for" || key == "as" || key == "parents" || key == "header" || key == "text") &&
      context == "step") {
    return fmt::format("`{}:` goes inside the `prefill:`/`decode:` map, or `as:` next to `select:`", key);
  }
  return {};
}

/// The workflow schema: which sections, keys and value kinds exist where.
class Parser : private YamlReader {
 public:
  explicit Parser(const SourceFile& file) : YamlReader(file, misplaced_key_hint) {}

  Workflow parse(const Node& root) {
    Workflow w;
    w.file = file_.name();
    w.source = file_.text();
    if (!root.IsMap()) {
      throw file_.error(node_location(root),
                        fmt::format("a workflow file is a map of sections, found {}", kind_name(root)),
                        "start with `name: my_workflow` and `steps:`");
    }
    Entries top = read_map(root, "workflow",
                           {"name", "description", "inputs", "params", "model", "models", "sampling",
                            "repair", "agents", "messages", "steps", "output"},
                           "top level");
    w.name = read_name(require(top, "name", "workflow"));
    if (auto* e = top.find("description")) w.description = read_text(*e);
    if (auto* e = top.find("inputs")) w.inputs = read_inputs(*e);
    if (auto* e = top.find("params")) w.params = read_params(*e);
    if (auto* e = top.find("model")) w.model = read_nonempty_text(*e);
    if (auto* e = top.find("models")) w.models = read_models(*e);
    if (auto* e = top.find("sampling")) w.sampling = read_sampling_map(*e);
    if (auto* e = top.find("repair")) w.repair = read_repair(*e);
    if (auto* e = top.find("agents")) w.agents = read_agents(*e);
    if (auto* e = top.find("messages")) w.messages = read_messages(*e);
    const Entry& steps = require(top, "steps", "workflow");
    w.steps = read_steps(steps);
    if (auto* e = top.find("output")) w.output = read_text(*e);
    return w;
  }

 private:
  // (the YAML readers come from YamlReader)

  Role read_role(const Entry& e) {
    Text t = read_text(e);
    if (t.value == "system") return Role::System;
    if (t.value == "user") return Role::User;
    if (t.value == "assistant") return Role::Assistant;
    static const Keys roles = {"system", "user", "assistant"};
    std::string hint = did_you_mean(t.value, roles);
    throw file_.error(t.where, fmt::format("unknown role `{}`", t.value),
                      hint.empty() ? "roles are system, user and assistant" : hint);
  }

  /// `repair: none | first:K | select:R`, a literal (the engine needs it before the call runs).
  RepairDecl read_repair(const Entry& e) {
    const Text t = read_nonempty_text(e);
    try {
      return {parse_repair_policy(t.value), t.where};
    } catch (const InputError& error) {
      throw file_.error(t.where, error.message(), error.hint());
    }
  }

  // ---- sections -----------------------------------------------------------------------------------

  ValueType read_type(const Entry& e) {
    Text t = read_text(e);
    static const Keys types = {"string", "int", "float", "bool", "list"};
    for (size_t i = 0; i < types.size(); ++i)
      if (t.value == types[i]) return static_cast<ValueType>(i);
    std::string hint = did_you_mean(t.value, types);
    throw file_.error(t.where, fmt::format("unknown type `{}`", t.value),
                      hint.empty() ? "types are string, int, float, bool and list" : hint);
  }

  std::vector<Input> read_inputs(const Entry& section) {
    std::vector<Input> out;
    Entries map = read_map(section.value, "inputs", {}, "inputs", &section.key.where);
    for (const Entry& e : map.items) {
      Input in;
      in.name = e.key;
      in.where = e.key.where;
      check_identifier(in.name, "an input");
      if (e.value.IsMap()) {
        Entries spec = read_map(e.value, e.key.value, {"type", "description"}, "an input");
        in.type = read_type(require(spec, "type", e.key.value));
        if (auto* d = spec.find("description")) in.description = read_text(*d);
      } else {
        in.type = read_type(e);
      }
      out.push_back(std::move(in));
    }
    return out;
  }

  /// `depth`: the lists `n` sits in. Block lists (`- - - x`) nest deeper than the bracket bound of
  /// precheck_yaml_text lets flow lists go, so the value bound is checked here, where the file is known.
  Literal read_literal(const Node& n, const Text& key, int depth = 0) {
    count_node(key.where);
    Literal lit;
    lit.where = n.IsNull() ? key.where : node_location(n);
    if (n.IsSequence()) {
      if (depth >= expr::kMaxValueDepth)
        throw file_.error(lit.where,
                          fmt::format("the value of `{}` nests lists more than {} levels deep", key.value,
                                      expr::kMaxValueDepth),
                          "values nest at most that deep (docs/expressions.md, \"Bounds\")");
      lit.type = ValueType::List;
      for (const Node& item : n) lit.items.push_back(read_literal(item, key, depth + 1));
      return lit;
    }
    if (!n.IsScalar()) {
      throw file_.error(lit.where,
                        fmt::format("the value of `{}` must be a number, text, boolean or list, found {}",
                                    key.value, kind_name(n)));
    }
    Text t = scalar_text(n);
    lit.text = t.value;
    if (t.style != ScalarStyle::Plain) return lit;  // quoted: always text
    if (t.value == "true" || t.value == "false") {
      lit.type = ValueType::Bool;
      lit.bool_value = t.value == "true";
    } else if (auto v = parse_integer(t, key.value)) {
      lit.type = ValueType::Int;
      lit.int_value = *v;
    } else if (is_number_literal(t.value)) {
      lit.type = ValueType::Float;
      lit.float_value = std::strtod(t.value.c_str(), nullptr);
    } else {
      Entry probe{key, n};
      std::string lower = t.value;
      for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (lower == "yes" || lower == "no" || lower == "on" || lower == "off" || lower == "true" ||
          lower == "false") {
        read_bool(probe);  // throws the yes/no hint
      }
    }
    return lit;
  }

  std::vector<Param> read_params(const Entry& section) {
    std::vector<Param> out;
    Entries map = read_map(section.value, "params", {}, "params", &section.key.where);
    for (const Entry& e : map.items) {
      Param p;
      p.name = e.key;
      p.where = e.key.where;
      check_identifier(p.name, "a parameter");
      if (e.value.IsMap()) {
        Entries spec = read_map(e.value, e.key.value, {"default", "description"}, "a parameter");
        const Entry& d = require(spec, "default", e.key.value);
        if (d.value.IsNull()) throw file_.error(d.key.where, "`default` has no value");
        p.value = read_literal(d.value, d.key);
        if (auto* desc = spec.find("description")) p.description = read_text(*desc);
      } else {
        if (e.value.IsNull()) {
          throw file_.error(e.key.where, fmt::format("parameter `{}` has no default", e.key.value),
                            "write `name: default`, e.g. `rounds: 3`");
        }
        p.value = read_literal(e.value, e.key);
      }
      out.push_back(std::move(p));
    }
    return out;
  }

  Sampling read_sampling_map(const Entry& section) {
    Entries map =
        read_map(section.value, "sampling", {"temperature", "top_p", "top_k", "max_tokens", "seed", "stop"},
                 "sampling", &section.key.where);
    Sampling s;
    s.where = section.key.where;
    read_sampling_keys(map, s);
    return s;
  }

  void read_sampling_keys(const Entries& map, Sampling& s) {
    if (auto* e = map.find("temperature")) s.temperature = read_float_setting(*e, 0, 100, false);
    if (auto* e = map.find("top_p")) s.top_p = read_float_setting(*e, 0, 1, true);
    if (auto* e = map.find("top_k")) s.top_k = read_int_setting(*e, 0);
    if (auto* e = map.find("max_tokens")) s.max_tokens = read_int_setting(*e, 1);
    if (auto* e = map.find("seed")) s.seed = read_int_setting(*e, 0);
    if (auto* e = map.find("stop")) {
      std::vector<Text> stops;
      if (e->value.IsScalar()) {
        stops.push_back(read_nonempty_text(*e));
      } else {
        for (const Entry& item : read_list(*e, "[\"\\n\\n\", \"END\"]"))
          stops.push_back(read_nonempty_text(item));
      }
      s.stop = std::move(stops);
    }
  }

  std::vector<Agent> read_agents(const Entry& section) {
    std::vector<Agent> out;
    if (section.value.IsSequence()) {
      for (const Entry& item : read_list(section, "[alice, bob]")) {
        Agent a;
        a.name = read_name(item);
        a.where = a.name.where;
        out.push_back(std::move(a));
      }
      return out;
    }
    Entries map = read_map(section.value, "agents", {}, "agents", &section.key.where);
    for (const Entry& e : map.items) {
      Agent a;
      a.name = e.key;
      a.where = e.key.where;
      check_identifier(a.name, "an agent");
      if (!e.value.IsNull()) {
        Entries spec = read_map(e.value, e.key.value, {"description", "color", "private", "model"}, "an agent");
        if (auto* d = spec.find("description")) a.description = read_text(*d);
        if (auto* m = spec.find("model")) a.model = read_name(*m);
        if (auto* c = spec.find("color")) a.color = read_color(*c);
        if (auto* p = spec.find("private")) a.private_default = read_bool(*p);
      }
      out.push_back(std::move(a));
    }
    return out;
  }

  /// `models: {NAME: FILE}` or `{NAME: {file: FILE, lora: FILE | [FILE | {file: FILE, scale: S}, ...]}}`.
  std::vector<ModelDecl> read_models(const Entry& section) {
    std::vector<ModelDecl> out;
    Entries map = read_map(section.value, "models", {}, "models", &section.key.where);
    for (const Entry& e : map.items) {
      ModelDecl m;
      m.name = e.key;
      m.where = e.key.where;
      check_identifier(m.name, "a model");
      if (m.name.value == "default")
        throw file_.error(m.where, "`default` names the run's model (-m) and cannot be declared",
                          "give the model another name");
      if (e.value.IsScalar()) {
        m.file = read_nonempty_text(e);
      } else if (!e.value.IsNull()) {
        Entries spec = read_map(e.value, e.key.value, {"file", "lora", "reuse"}, "a model");
        if (auto* f = spec.find("file")) m.file = read_nonempty_text(*f);
        if (auto* l = spec.find("lora"))
          for (const Entry& item : one_or_list(*l, "[math.gguf, {file: style.gguf, scale: 0.5}]"))
            m.lora.push_back(read_adapter(item));
        if (auto* r = spec.find("reuse"))
          for (const Entry& item : one_or_list(*r, "[{from: default, plan: partial, layers: [10, 15]}, plan.json]"))
            m.reuse.push_back(read_reuse(item));
      }
      out.push_back(std::move(m));
    }
    return out;
  }

  /// A value written once (`key: X`) or as a list (`key: [X, Y]`): its items.
  std::vector<Entry> one_or_list(const Entry& e, std::string_view example) {
    if (e.value.IsSequence()) return read_list(e, example);
    return {e};
  }

  /// `{from: MODEL, plan: recompute | reuse | partial, layers: [s, e]}` (layers: partial only), or the path
  /// of a plan file.
  ReuseDecl read_reuse(const Entry& e) {
    ReuseDecl r;
    r.where = node_location(e.value);
    if (e.value.IsScalar()) {
      r.file = read_nonempty_text(e);
      return r;
    }
    Entries spec = read_map(e.value, "reuse", {"from", "plan", "layers"}, "a cross-model plan", &e.key.where);
    r.from = read_name(require(spec, "from", "reuse"));
    r.plan = read_text(require(spec, "plan", "reuse"));
    static const Keys plans = {"recompute", "reuse", "partial"};
    if (std::find(plans.begin(), plans.end(), r.plan.value) == plans.end()) {
      const std::string hint = did_you_mean(r.plan.value, plans);
      throw file_.error(r.plan.where, fmt::format("unknown plan `{}`", r.plan.value),
                        hint.empty() ? "plans are recompute, reuse and partial" : hint);
    }
    const Entry* layers = spec.find("layers");
    if (r.plan.value == "partial") {
      if (!layers)
        throw file_.error(r.plan.where, "a partial plan needs `layers: [s, e]`",
                          "the layers s..e-1 are recomputed, e.g. `layers: [10, 15]`");
      const std::vector<Entry> bounds = read_list(*layers, "[10, 15]");
      if (bounds.size() != 2)
        throw file_.error(layers->key.where, "`layers` takes two layers: [first, end)", "e.g. `layers: [10, 15]`");
      const auto layer = [&](const Entry& b) {
        const Text t = read_text(b);
        const std::optional<int64_t> v = parse_integer(t, "layers");
        if (!v || *v < 0 || *v > 100000)
          throw file_.error(t.where, fmt::format("`{}` is not a layer number", t.value), "layers are whole numbers >= 0");
        return *v;
      };
      r.begin = layer(bounds[0]);
      r.end = layer(bounds[1]);
    } else if (layers) {
      throw file_.error(layers->key.where, fmt::format("a {} plan takes no `layers`", r.plan.value),
                        "only `plan: partial` recomputes chosen layers");
    }
    return r;
  }

  AdapterDecl read_adapter(const Entry& e) {
    AdapterDecl a;
    a.where = node_location(e.value);
    if (!e.value.IsMap()) {
      a.file = read_nonempty_text(e);
      return a;
    }
    Entries spec = read_map(e.value, "adapter", {"file", "scale"}, "a LoRA adapter");
    a.file = read_nonempty_text(require(spec, "file", "adapter"));
    if (auto* s = spec.find("scale")) {
      const FloatSetting scale = read_float_setting(*s, -100.0, 100.0, false);
      if (!std::holds_alternative<double>(scale.value))
        throw file_.error(scale.where, "an adapter's `scale` must be a number", "e.g. `scale: 0.5`");
      a.scale = std::get<double>(scale.value);
    }
    return a;
  }

  Text read_color(const Entry& e) {
    Text t = read_text(e);
    static const Keys colors = {"black",   "red",  "green", "yellow", "blue",
                                "magenta", "cyan", "white", "gray"};
    bool hex = t.value.size() == 7 && t.value[0] == '#' &&
               std::all_of(t.value.begin() + 1, t.value.end(), [](char c) { return std::isxdigit(c); });
    if (std::find(colors.begin(), colors.end(), t.value) != colors.end() || hex) return t;
    std::string hint = did_you_mean(t.value, colors);
    throw file_.error(t.where, fmt::format("unknown color `{}`", t.value),
                      hint.empty() ? fmt::format("colors are {} or #rrggbb", fmt::join(colors, ", ")) : hint);
  }

  std::vector<Message> read_messages(const Entry& section) {
    std::vector<Message> out;
    Entries map = read_map(section.value, "messages", {}, "messages", &section.key.where);
    for (const Entry& e : map.items) {
      Message m;
      m.name = e.key;
      m.where = e.key.where;
      check_identifier(m.name, "a message");
      Entries spec = read_map(e.value, e.key.value,
                              {"role", "text", "field", "prompt", "pml", "private", "pin", "priority", "ttl", "release"},
                              fmt::format("message `{}`", e.key.value), &e.key.where);
      m.retention = read_retention(spec);
      if (auto* r = spec.find("role")) m.role = read_role(*r);
      if (auto* t = spec.find("text")) m.text = read_text(*t);
      if (auto* f = spec.find("field")) m.field = read_nonempty_text(*f);
      if (auto* p = spec.find("prompt")) m.prompt = read_nonempty_text(*p);
      if (auto* p = spec.find("pml")) m.pml = read_nonempty_text(*p);
      if (auto* p = spec.find("private")) m.private_to = read_nonempty_text(*p);
      if (m.prompt.has_value() != m.pml.has_value())
        throw file_.error(m.where,
                          m.prompt ? fmt::format("message `{}` has a `prompt:` but no `pml:` schema file", e.key.value)
                                   : fmt::format("message `{}` has `pml:` but no `prompt:`", e.key.value),
                          "a PML message is `{pml: schemas/x.pml, prompt: \"<prompt schema='x'>...</prompt>\"}`");
      if (m.prompt && m.role != Role::None)
        throw file_.error(m.where, fmt::format("message `{}`: a PML prompt takes no `role:`", e.key.value),
                          "write role tags (<system>, <user>, <assistant>) inside the PML schema");
      int sources = m.text.has_value() + m.field.has_value() + m.prompt.has_value();
      if (sources != 1) {
        throw file_.error(
            m.where,
            fmt::format("message `{}` needs exactly one of `text:`, `field:` or `prompt:`", e.key.value),
            sources == 0 ? "e.g. `text: \"Solve: {{ problem }}\"`" : "keep only one of them");
      }
      out.push_back(std::move(m));
    }
    return out;
  }

  // ---- steps --------------------------------------------------------------------------------------

  std::vector<Step> read_steps(const Entry& section) {
    std::vector<Step> out;
    std::vector<Entry> items = read_list(section, "\n  - decode: {as: reply, parents: [question]}");
    if (items.empty())
      throw file_.error(section.key.where, "`steps` is empty", "a workflow needs at least one step");
    for (const Entry& item : items) out.push_back(read_step(item.value, section.key.where));
    return out;
  }

  Step read_step(const Node& n, const SourceLocation& list_where) {
    static const Keys kinds = {"prefill", "decode", "repeat", "let", "select"};
    static const Keys all_step_keys = {"prefill", "decode", "repeat",  "let",     "select",  "steps",
                                       "until",   "when",   "as",      "for",     "parents", "header",
                                       "text",    "role",   "message", "private", "agent"};
    if (!n.IsMap()) {
      throw file_.error(n.IsNull() ? list_where : node_location(n),
                        fmt::format("a step must be a map, found {}", kind_name(n)),
                        "steps look like `- decode: {as: reply, parents: [question]}`");
    }
    Entries map = read_map(n, "step", {}, "step");
    const Entry* kind = nullptr;
    for (const Entry& e : map.items) {
      if (std::find(kinds.begin(), kinds.end(), e.key.value) == kinds.end()) continue;
      if (kind) {
        throw file_.error(
            e.key.where,
            fmt::format("a step has one kind, but this one has `{}` and `{}`", kind->key.value, e.key.value),
            "start a new list item (`- `) for the second step");
      }
      kind = &e;
    }
    if (!kind) {
      for (const Entry& e : map.items) {
        if (std::find(all_step_keys.begin(), all_step_keys.end(), e.key.value) != all_step_keys.end())
          continue;
        std::string hint = did_you_mean(e.key.value, kinds);
        if (hint.empty()) hint = misplaced_key_hint(e.key.value, "step");
        throw file_.error(
            e.key.where, fmt::format("unknown key `{}` in step", e.key.value),
            hint.empty() ? "a step starts with prefill:, decode:, repeat:, let: or select:" : hint);
      }
      throw file_.error(map.where, "step has no kind",
                        "a step starts with prefill:, decode:, repeat:, let: or select:");
    }
    const std::string& k = kind->key.value;
    Keys allowed = {k, "when"};
    if (k == "repeat") allowed = {"repeat", "steps", "until", "when"};
    if (k == "select") allowed = {"select", "as", "when"};
    if (k == "prefill" || k == "decode") allowed = {k};
    for (const Entry& e : map.items) {
      if (std::find(allowed.begin(), allowed.end(), e.key.value) != allowed.end()) continue;
      bool known = std::find(all_step_keys.begin(), all_step_keys.end(), e.key.value) != all_step_keys.end();
      if (!known) {
        std::string hint = did_you_mean(e.key.value, allowed);
        if (hint.empty()) hint = misplaced_key_hint(e.key.value, "step");
        if (hint.empty()) hint = fmt::format("valid keys next to `{}:` are {}", k, fmt::join(allowed, ", "));
        throw file_.error(e.key.where, fmt::format("unknown key `{}` in step", e.key.value), hint);
      }
      std::string hint = misplaced_key_hint(e.key.value, "step");
      if (k == "prefill" || k == "decode")
        hint = fmt::format("`{}:` goes inside the `{}:` map", e.key.value, k);
      throw file_.error(e.key.where, fmt::format("`{}` does not belong next to `{}:`", e.key.value, k), hint);
    }
    std::optional<Text> when;
    if (auto* e = map.find("when")) when = read_expression(*e);
    if (k == "prefill" || k == "decode") return Step{read_call(*kind)};
    if (k == "let") return Step{read_let(*kind, std::move(when))};
    if (k == "select") {
      Select s;
      s.where = kind->key.where;
      s.choice = read_expression(*kind);
      s.as = read_name(require(map, "as", "select step"));
      s.when = std::move(when);
      return Step{std::move(s)};
    }
    Repeat r;
    r.where = kind->key.where;
    r.loop = read_loop(*kind);
    r.when = std::move(when);
    if (auto* e = map.find("until")) r.until = read_expression(*e);
    r.steps = read_steps(require(map, "steps", "repeat step"));
    return Step{std::move(r)};
  }

  Let read_let(const Entry& e, std::optional<Text> when) {
    Let l;
    l.where = e.key.where;
    l.when = std::move(when);
    Entries map = read_map(e.value, "let", {}, "let", &e.key.where);
    if (map.items.empty()) throw file_.error(e.key.where, "`let` binds nothing");
    for (const Entry& b : map.items) {
      check_identifier(b.key, "a let binding");
      l.bindings.push_back(Binding{b.key, read_expression(b)});
    }
    return l;
  }

  Loop read_loop(const Entry& e) {
    Text t = read_nonempty_text(e);
    check_expression(t, e.key.value);
    std::optional<LoopHeader> header = split_loop_header(t.value);
    if (!header) {
      throw file_.error(t.where, fmt::format("`{}` takes `NAME in EXPR`, found `{}`", e.key.value, t.value),
                        e.key.value == "repeat"
                            ? "e.g. `repeat: \"r in range(1, rounds)\"` (the range bounds the loop)"
                            : "e.g. `for: \"i in range(agents)\"`");
    }
    Loop loop;
    loop.where = t.where;
    loop.variable = Text{header->variable, locate(t, header->variable_offset), t.style};
    loop.iterable = Text{header->iterable, locate(t, header->iterable_offset), t.style};
    return loop;
  }

  Target read_target(const Entry& e) {
    Text t = read_nonempty_text(e);
    check_expression(t, "as");
    Target out{t, t, {}};
    size_t i = 0;
    while (i < t.value.size() && (std::isalnum(static_cast<unsigned char>(t.value[i])) || t.value[i] == '_'))
      ++i;
    out.base = Text{t.value.substr(0, i), t.where, t.style};
    auto bad = [&](size_t at) {
      return file_.error(locate(t, at),
                         fmt::format("`as` takes a name or an indexed name, found `{}`", t.value),
                         "e.g. `as: reply` or `as: \"answer[r][i]\"`");
    };
    if (!is_identifier(out.base.value)) throw bad(0);
    while (i < t.value.size()) {
      if (t.value[i] != '[') throw bad(i);
      int depth = 0;
      size_t start = i + 1;
      for (; i < t.value.size(); ++i) {
        if (t.value[i] == '[') ++depth;
        if (t.value[i] == ']' && --depth == 0) break;
      }
      if (i >= t.value.size()) throw bad(start - 1);
      std::string index = t.value.substr(start, i - start);
      if (index.find_first_not_of(" \t") == std::string::npos) throw bad(start);
      out.indices.push_back(Text{index, locate(t, start), t.style});
      ++i;
    }
    return out;
  }

  Parent parent_from_text(const Text& t) {
    Parent p;
    p.ref = t;
    p.where = t.where;
    check_expression(t, "parents");
    size_t i = 0;
    while (i < t.value.size() && (std::isalnum(static_cast<unsigned char>(t.value[i])) || t.value[i] == '_'))
      ++i;
    std::string lead = t.value.substr(0, i);
    if (is_identifier(lead)) p.base = lead;
    if (p.base == t.value) {
      p.form = ParentForm::Name;
    } else if (!comprehension_variables(t.value).empty()) {
      p.form = ParentForm::Comprehension;
    } else {
      p.form = ParentForm::Indexed;
    }
    return p;
  }

  std::vector<Parent> read_parents(const Entry& e) {
    std::vector<Parent> out;
    for (const Entry& item : read_list(e, "[question, \"answer[r-1][j] for j in range(agents)\"]")) {
      if (item.value.IsMap()) {
        Entries map = read_map(item.value, "parent", {"ref", "at"}, "a parent");
        Parent p = parent_from_text(read_nonempty_text(require(map, "ref", "parent")));
        p.where = map.where;
        if (auto* at = map.find("at")) p.at = read_int_setting(*at, 0);
        out.push_back(std::move(p));
      } else {
        out.push_back(parent_from_text(read_nonempty_text(item)));
      }
    }
    return out;
  }

  /// `pin`, `priority`, `ttl`, `release`: literals (the engine reads them from the compiled plan).
  Retention read_retention(const Entries& map) {
    Retention r;
    auto literal = [&](const Entry& e, std::string_view key, int64_t low, int64_t high, std::string_view unit) {
      const Text t = read_nonempty_text(e);
      const std::optional<int64_t> v = parse_integer(t, key);
      if (!v || *v < low || *v > high)
        throw file_.error(t.where, fmt::format("`{}` must be a whole number from {} to {}{}, got `{}`", key, low,
                                               high, unit, t.value),
                          fmt::format("e.g. `{}: {}` (a literal: the engine reads it before the run)", key,
                                      key == "ttl" ? 600 : 10));
      return *v;
    };
    if (auto* x = map.find("pin")) r.pin = read_bool(*x);
    if (auto* x = map.find("release")) r.release = read_bool(*x);
    if (auto* x = map.find("priority")) r.priority = literal(*x, "priority", -1000, 1000, "");
    if (auto* x = map.find("ttl")) r.ttl_s = literal(*x, "ttl", 1, 86400 * 365, " seconds");
    if (r.pin && r.release)
      throw file_.error(map.find("release")->key.where, "`pin: true` and `release: true` contradict each other",
                        "keep one of them");
    return r;
  }

  Call read_call(const Entry& e) {
    Call c;
    c.kind = e.key.value == "decode" ? CallKind::Decode : CallKind::Prefill;
    c.where = e.key.where;
    Keys keys = {"as",   "role", "parents",  "new_offset", "agent",   "private", "for",
                 "when", "pin",  "priority", "ttl",        "release", "model",   "repair"};
    if (c.kind == CallKind::Prefill) {
      keys.insert(keys.end(), {"text", "message"});
    } else {
      keys.insert(keys.end(), {"header", "temperature", "top_p", "top_k", "max_tokens", "seed", "stop"});
    }
    Entries map = read_map(e.value, e.key.value, keys, e.key.value, &e.key.where);
    c.as = read_target(require(map, "as", e.key.value));
    if (auto* x = map.find("role")) c.role = read_role(*x);
    if (auto* x = map.find("parents")) c.parents = read_parents(*x);
    if (auto* x = map.find("new_offset")) c.new_offset = read_int_setting(*x, 0);
    if (auto* x = map.find("agent")) c.agent = read_nonempty_text(*x);
    if (auto* x = map.find("private")) c.private_to = read_nonempty_text(*x);
    if (auto* x = map.find("for")) c.for_each = read_loop(*x);
    if (auto* x = map.find("when")) c.when = read_expression(*x);
    if (auto* x = map.find("model")) c.model = read_name(*x);
    if (auto* x = map.find("repair")) c.repair = read_repair(*x);
    c.retention = read_retention(map);
    if (c.kind == CallKind::Prefill) {
      if (auto* x = map.find("text")) c.text = read_text(*x);
      if (auto* x = map.find("message")) c.message = read_name(*x);
      if (c.text.has_value() == c.message.has_value()) {
        throw file_.error(map.where, "prefill needs exactly one of `text:` or `message:`",
                          c.text ? "keep only one of them" : "e.g. `text: \"Question: {{ question }}\"`");
      }
    } else {
      if (auto* x = map.find("header")) {
        c.header = read_text(*x);
        if (c.header->value.empty()) {
          throw file_.error(x->key.where, "decode `header` is empty",
                            "the first generated token comes from the last header token; give some text or "
                            "remove `header:` and set `role: assistant`");
        }
      } else if (c.role == Role::None) {
        throw file_.error(map.where, "decode needs a `header:` or a `role:`",
                          "the reply is generated after the header (a role's chat-template header counts)");
      }
      c.sampling.where = map.where;
      read_sampling_keys(map, c.sampling);
    }
    return c;
  }
};

std::string mark_message(const YAML::Exception& e) {
  // yaml-cpp prefixes "yaml-cpp: error at line N, column M: "; the location is ours to print.
  std::string msg = e.msg;
  if (msg.empty()) msg = e.what();
  return msg;
}

/// The line of a second YAML document's first content, if the text has one after a `---` or `...` marker.
std::optional<int> second_document_line(const SourceFile& file) {
  bool seen_content = false;
  bool after_marker = false;
  for (int line = 1; line <= file.line_count(); ++line) {
    std::string text = file.line_text(line);
    bool marker = (text.rfind("---", 0) == 0 || text.rfind("...", 0) == 0) &&
                  (text.size() == 3 || text[3] == ' ' || text[3] == '\t');
    size_t first = text.find_first_not_of(" \t\r", marker ? 3 : 0);
    bool blank = first == std::string::npos || text[first] == '#';
    if (marker) {
      if (seen_content) after_marker = true;
      if (after_marker && !blank) return line;
      seen_content |= !blank;
      continue;
    }
    if (blank || (!seen_content && text[first] == '%')) continue;
    if (after_marker) return line;
    seen_content = true;
  }
  return std::nullopt;
}

}  // namespace

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_spaces(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

/// At `i`: an identifier followed by spaces, `in` and a space or bracket; sets `name` and `after` (past
/// `in`).
bool match_name_in(std::string_view s, size_t i, std::string& name, size_t& after) {
  size_t start = i;
  if (i >= s.size() || !is_identifier_start(s[i])) return false;
  while (i < s.size() && is_identifier_char(s[i])) ++i;
  name = std::string(s.substr(start, i - start));
  size_t spaces = skip_spaces(s, i);
  if (spaces == i || s.substr(spaces, 2) != "in") return false;
  i = spaces + 2;
  if (i >= s.size() || !(is_space(s[i]) || s[i] == '(' || s[i] == '[')) return false;
  after = i;
  return true;
}

}  // namespace

std::optional<LoopHeader> split_loop_header(std::string_view text) {
  LoopHeader out;
  size_t i = skip_spaces(text, 0);
  size_t after = 0;
  if (!match_name_in(text, i, out.variable, after)) return std::nullopt;
  out.variable_offset = i;
  out.iterable_offset = skip_spaces(text, after);
  if (out.iterable_offset >= text.size()) return std::nullopt;
  size_t end = text.size();
  while (end > out.iterable_offset && is_space(text[end - 1])) --end;
  out.iterable = std::string(text.substr(out.iterable_offset, end - out.iterable_offset));
  return out;
}

std::vector<std::string> comprehension_variables(std::string_view text) {
  std::vector<std::string> out;
  for (size_t i = text.find("for"); i != std::string_view::npos; i = text.find("for", i + 3)) {
    if (i == 0 || !is_space(text[i - 1]) || i + 3 >= text.size() || !is_space(text[i + 3])) continue;
    std::string name;
    size_t after = 0;
    if (match_name_in(text, skip_spaces(text, i + 3), name, after)) out.push_back(name);
  }
  return out;
}

SourceLocation locate(const Text& text, size_t offset) {
  SourceLocation where = text.where;
  offset = std::min(offset, text.value.size());
  std::string_view value(text.value);
  bool lines_are_kept = text.style == ScalarStyle::Literal;
  size_t leading_newlines = 0;
  while (lines_are_kept && leading_newlines < value.size() && value[leading_newlines] == '\n')
    ++leading_newlines;
  size_t line_start = 0;
  int line_delta = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (lines_are_kept && value[i] == '\n') {
      ++line_delta;
      line_start = i + 1;
    }
  }
  if (lines_are_kept && offset >= leading_newlines) line_delta -= static_cast<int>(leading_newlines);
  int chars = 0;
  for (size_t i = line_start; i < offset; ++i) {
    if ((static_cast<unsigned char>(value[i]) & 0xC0) != 0x80) ++chars;
  }
  where.line += std::max(0, line_delta);
  where.col += chars;
  return where;
}

Workflow parse_workflow(std::string_view text, const std::string& file_name) {
  SourceFile file{std::string(text), file_name};
  precheck_yaml_text(file);
  Node document;
  try {
    // YAML::LoadAll can loop forever on some malformed input (found by fuzzing yaml-cpp 0.7); Load parses the
    // first document only, and a later one is found by its `---` marker below.
    document = YAML::Load(file.text());
  } catch (const YAML::Exception& e) {
    SourceLocation where{file_name, 1, 1};
    if (!e.mark.is_null() && e.mark.pos >= 0) {
      // An error found at the end of the file ("flow not closed") is shown after the last character written.
      size_t pos = static_cast<size_t>(e.mark.pos);
      size_t last = file.text().find_last_not_of(" \t\r\n");
      if (last != std::string::npos && pos > last) pos = last + 1;
      where = file.at_offset(pos);
    }
    throw file.error(where, fmt::format("YAML syntax error: {}", mark_message(e)),
                     "check indentation (spaces, not tabs), colons and matching quotes/brackets");
  }
  if (document.IsNull()) {
    throw InputError("workflow file is empty", "a workflow needs at least `name:` and `steps:`",
                     SourceLocation{file_name, 0, 0});
  }
  if (auto second = second_document_line(file)) {
    throw file.error(SourceLocation{file_name, *second, 1},
                     "a workflow file holds one YAML document, found a second one",
                     "remove the `---` separator or split the file");
  }
  try {
    Workflow w = Parser(file).parse(document);
    check_workflow(w, file);
    return w;
  } catch (const YAML::Exception& e) {
    // Accessors should not throw once a document is loaded; keep any surprise an InputError with a place.
    SourceLocation where{file_name, 1, 1};
    if (!e.mark.is_null() && e.mark.pos >= 0) where = file.at_offset(static_cast<size_t>(e.mark.pos));
    throw file.error(where, fmt::format("cannot read YAML: {}", mark_message(e)));
  }
}

Workflow load_workflow(const std::string& path) {
  // The size is checked before anything is read: a 1 GB (sparse) file costs nothing.
  return parse_workflow(read_input_file(path, "workflow file", input_policy().workflow_bytes), path);
}

}  // namespace choreo::dsl
