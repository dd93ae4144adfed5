#pragma once
// The workflow AST: what a workflow file says after the YAML and schema checks, before any expression is
// parsed. Expressions and templates are kept as text together with the location of their first character, so
// the compile step (dsl/expr) can parse them and point its errors at the right character of the file.
// The language is described in docs/workflow-language.md.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/repair_policy.h"

namespace choreo::dsl {

/// How a scalar was written in YAML; decides how an offset inside its value maps back to the file.
enum class ScalarStyle { Plain, SingleQuoted, DoubleQuoted, Literal, Folded };

/// A string from the file (a template, an expression or a name) and where its first character is.
/// For `|`/`>` blocks `where` is the first character of the first non-blank content line.
struct Text {
  std::string value;
  SourceLocation where;
  ScalarStyle style = ScalarStyle::Plain;
};

/// An integer setting: a literal checked at parse time, or an expression evaluated at run time.
struct IntSetting {
  std::variant<int64_t, Text> value;
  SourceLocation where;
};

/// A real-valued setting: a literal checked at parse time, or an expression evaluated at run time.
struct FloatSetting {
  std::variant<double, Text> value;
  SourceLocation where;
};

/// Sampling settings; unset fields inherit (call → workflow `sampling:` → engine defaults).
struct Sampling {
  std::optional<FloatSetting> temperature;
  std::optional<FloatSetting> top_p;
  std::optional<IntSetting> top_k;
  std::optional<IntSetting> max_tokens;
  std::optional<IntSetting> seed;
  std::optional<std::vector<Text>> stop;  ///< templates
  SourceLocation where;
};

/// A repair policy as written (`repair: first:16`; common/repair_policy.h), checked when the file is read.
struct RepairDecl {
  RepairPolicy policy;
  SourceLocation where;
};

/// The types an input or parameter can have.
enum class ValueType { String, Int, Float, Bool, List };

/// A value given per run (`inputs: {problem: string}`), e.g. one dataset row or a `--input` flag.
struct Input {
  Text name;
  ValueType type = ValueType::String;
  std::optional<Text> description;
  SourceLocation where;
};

/// A literal value (a parameter default); `items` holds the elements of a list.
struct Literal {
  ValueType type = ValueType::String;
  std::string text;  ///< the source characters of a scalar
  int64_t int_value = 0;
  double float_value = 0;
  bool bool_value = false;
  std::vector<Literal> items;
  SourceLocation where;
};

/// A named constant with a default that the command line may override (`params: {rounds: 3}`).
struct Param {
  Text name;
  Literal value;
  std::optional<Text> description;
  SourceLocation where;
};

/// A LoRA adapter of a declared model: `lora: FILE`, or `{file: FILE, scale: S}` (scale 1 by default).
struct AdapterDecl {
  Text file;  ///< a GGUF adapter, as written (relative to the workflow's directory when not found as given)
  double scale = 1.0;
  SourceLocation where;
};

/// How a declared model reads messages another model encoded (`reuse: [{from: M, plan: P, layers: [s, e]}]`,
/// or `reuse: PLAN.json`;
/// DESIGN.md §6).
struct ReuseDecl {
  std::optional<Text> file;     ///< `reuse: PLAN.json`: a plan file `choreo profile reuse` wrote (it names
                                ///< both models by fingerprint); the fields below are then unset
  Text from;                    ///< the sender: a model name (`default`: the run's model)
  Text plan;                    ///< recompute, reuse or partial
  std::optional<int64_t> begin, end;  ///< partial: `layers: [s, e]`, the layers recomputed
  SourceLocation where;
};

/// A model calls and agents can choose with `model:` (`models: {NAME: FILE}` or `{NAME: {file:, lora:}}`).
struct ModelDecl {
  Text name;
  std::optional<Text> file;         ///< a GGUF; absent: the run's model (-m)
  std::vector<AdapterDecl> lora;    ///< adapters over it, stacked in order
  std::vector<ReuseDecl> reuse;     ///< its cross-model plans, one per sender
  SourceLocation where;
};

/// A participant in the workflow; `private:` messages belong to one.
struct Agent {
  Text name;
  std::optional<Text> description;
  std::optional<Text> color;
  bool private_default = false;  ///< `private: true`: the agent's calls make messages private to it
  std::optional<Text> model;     ///< `model: NAME`: the model its calls run on (a call's own `model:` wins)
  SourceLocation where;
};

/// The chat role a message is wrapped in; None means raw text without a chat template turn.
enum class Role { None, System, User, Assistant };

/// A message declared under `messages:`; exactly one of text / field / prompt is set.
/// KV retention hints of a message or call (docs/store.md, "Tiers"): literals, known before the run.
struct Retention {
  bool pin = false;              ///< `pin: true`: its encoding stays in T0 while the run lasts
  int64_t priority = 0;          ///< `priority: N` (-1000..1000): lower goes first when T0 must make room
  std::optional<int64_t> ttl_s;  ///< `ttl: SECONDS`: unused this long, it goes first
  bool release = false;          ///< `release: true`: once this run will not read it again, it goes first
  bool any() const { return pin || priority != 0 || ttl_s || release; }
};

struct Message {
  Text name;
  Role role = Role::None;
  std::optional<Text> text;        ///< a template
  std::optional<Text> field;       ///< a dataset field name, used verbatim
  std::optional<Text> prompt;      ///< a PML prompt (a template), with `pml` naming its schema file
  std::optional<Text> pml;         ///< the PML schema file of `prompt` (a template; relative to the workflow)
  std::optional<Text> private_to;  ///< an agent name (or a template naming one)
  Retention retention;
  SourceLocation where;
};

/// `NAME in EXPR`: the header of a `for:` fan-out or a `repeat:` loop.
struct Loop {
  Text variable;
  Text iterable;  ///< an expression
  SourceLocation where;
};

/// The name a step defines: `cot` or `answer[r][i]` (base name plus index expressions).
struct Target {
  Text text;
  Text base;
  std::vector<Text> indices;
};

/// How a parent entry is written.
enum class ParentForm {
  Name,          ///< `start`
  Indexed,       ///< `answer[r-1][j]` (any expression starting with a name)
  Comprehension  ///< `answer[r-1][j] for j in range(agents) if j != i`: many parents
};

/// One entry of `parents:`; `at` places it at an explicit offset.
struct Parent {
  Text ref;
  ParentForm form = ParentForm::Name;
  std::string base;  ///< the leading name of `ref` (empty if it does not start with one)
  std::optional<IntSetting> at;
  SourceLocation where;
};

/// Which engine call a `prefill:` / `decode:` step makes.
enum class CallKind { Prefill, Decode };

/// A prefill or decode call, possibly fanned out with `for:`.
struct Call {
  CallKind kind = CallKind::Prefill;
  Target as;
  Role role = Role::None;
  std::optional<Text> text;     ///< prefill: a template
  std::optional<Text> message;  ///< prefill: the name of a declared message to encode here
  std::optional<Text> header;   ///< decode: a template
  std::vector<Parent> parents;
  std::optional<IntSetting> new_offset;
  std::optional<Text> agent;       ///< agent name or template
  std::optional<Text> private_to;  ///< agent name or template
  std::optional<Text> model;       ///< the model it runs on: a name under `models:` (overrides the agent's)
  Sampling sampling;               ///< decode: overrides
  std::optional<RepairDecl> repair;  ///< `repair:` for its cached parents (over the workflow's)
  std::optional<Loop> for_each;
  std::optional<Text> when;  ///< an expression; the call is skipped when false
  Retention retention;
  SourceLocation where;
};

/// `let: {name: expr, ...}`: binds names to values computed at run time.
struct Binding {
  Text name;
  Text value;  ///< an expression
};

/// A `let:` step.
struct Let {
  std::vector<Binding> bindings;
  std::optional<Text> when;
  SourceLocation where;
};

/// A `select:` step: names the message an expression picks (`select: "cot[best]"`, `as: chosen`).
struct Select {
  Text as;
  Text choice;  ///< an expression
  std::optional<Text> when;
  SourceLocation where;
};

struct Step;

/// A `repeat:` loop over `NAME in EXPR` (the iterable bounds it) with an optional early stop.
struct Repeat {
  Loop loop;
  std::optional<Text> until;  ///< an expression checked after each iteration
  std::optional<Text> when;
  std::vector<Step> steps;
  SourceLocation where;
};

/// One entry of a `steps:` list.
struct Step {
  std::variant<Call, Repeat, Let, Select> node;
};

/// A whole workflow file.
struct Workflow {
  Text name;
  std::optional<Text> description;
  std::vector<Input> inputs;
  std::vector<Param> params;
  std::optional<Text> model;
  std::vector<ModelDecl> models;  ///< `models:`, in file order
  Sampling sampling;
  std::optional<RepairDecl> repair;  ///< `repair:`: the calls' repair policy, unless a call gives its own
  std::vector<Agent> agents;
  std::vector<Message> messages;
  std::vector<Step> steps;
  std::optional<Text> output;  ///< a template
  std::string file;            ///< the name used in locations
  std::string source;          ///< the file's text, for quoting lines in later errors

  /// The text of a 1-based line of the file (no newline), or "" if out of range.
  std::string source_line(int line) const {
    if (line <= 0) return {};
    size_t start = 0;
    for (int l = 1; l < line; ++l) {
      start = source.find('\n', start);
      if (start == std::string::npos) return {};
      ++start;
    }
    size_t end = source.find('\n', start);
    std::string out = source.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!out.empty() && out.back() == '\r') out.pop_back();
    return out;
  }
};

}  // namespace choreo::dsl
