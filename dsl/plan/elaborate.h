#pragma once
// The one implementation of the workflow language's semantics (DESIGN.md §1: workflow → dsl::compile → plan →
// interpreter). The elaborator walks a workflow — inputs and params, declared messages, `for` fan-outs,
// `repeat`/`until` loops, `let`/`select`/`when`, `as` targets, parents and offsets, agents, texts, headers and
// sampling settings — and hands every engine batch it decides on to an Executor, which returns the values
// the new names are bound to. Two executors exist:
//  - compile (dsl/plan/compile.cc, Knowledge::Partial): what only a run knows (generated text, inputs not
//    given) stays unknown; a condition that reads it makes what it guards conditional, a choice of message
//    becomes every message it could pick. The executor records the batch as plan nodes and returns messages
//    without text.
//  - run (runtime/exec/interpreter.cc, Knowledge::Complete): every value is known. The executor checks the
//    batch against the compiled plan, runs it on the engine and returns the messages it made, so later steps
//    read their text.
// docs/workflow-language.md, "How a workflow runs", describes the result for users.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsl/expr/value.h"
#include "dsl/plan/plan.h"
#include "dsl/plan/pml_message.h"
#include "dsl/workflow.h"

namespace choreo::dsl::plan {

/// A decode's sampling settings as far as they are known: the workflow's `sampling:`, overridden field by
/// field by the call's. Unset fields are nullopt (the engine's defaults apply); so are fields only the run
/// knows (then `complete` is false).
struct SamplingValues {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> seed;
  std::optional<std::vector<std::string>> stop;  ///< the rendered stop strings of the last `stop:` given
  bool complete = true;
};

/// One branch of a batch, as the elaborator decided it.
struct Branch {
  Node node;  ///< name, kind, agent, parents (Edge::parent is the executor's message id), offsets, text
  std::vector<int64_t> indices;             ///< the `as` indices (`answer[r][i]`: r, i)
  Role role = Role::None;                   ///< the call's role, else its declared message's
  const Message* message = nullptr;         ///< a declared message, or the one `prefill: {message: X}` names
  std::optional<std::string> header;        ///< decodes: the rendered header ("" without one), when known
  SamplingValues sampling;                  ///< decodes
  std::optional<std::string> pml_file;      ///< PML messages: the schema path as written (rendered)
  std::optional<std::string> pml_prompt;    ///< PML messages: the rendered prompt
  PmlMessage pml;                           ///< PML messages: the schema and prompt, parsed (when both known)
};

/// Runs or records the batches the elaborator decides on.
class Executor {
 public:
  virtual ~Executor() = default;
  /// One batch, in order: the declared messages (NodeKind::Message, once, first), then each call's branches.
  /// Returns the value each branch's name is bound to, in order: a message (expr::Value::message with the
  /// executor's id), or, for a PML message, the list of its pieces.
  virtual std::vector<expr::Value> execute(NodeKind kind, std::vector<Branch>& branches,
                                           const SourceLocation& where) = 0;
};

/// How much the elaborator may leave unknown.
enum class Knowledge {
  Partial,   ///< compile: inputs may be missing and generated text is unknown
  Complete,  ///< run: every input has a value and every message its text
};

/// What the elaboration found besides the batches.
struct Elaboration {
  std::optional<std::string> output;  ///< the rendered `output:` when known
  std::vector<UnrolledLoop> loops;    ///< every `repeat` entered, as Node::iterations index them
  std::vector<std::string> notes;     ///< what a check could not decide, for the user
};

/// The value of every input and param of `workflow` for `arguments` (inputs may also name a message's
/// `field:`): the file's declarations and defaults, overridden by `--input`/`--param` text converted to the
/// declared type. An input without a value is nullopt (Knowledge::Partial) or an InputError
/// (Knowledge::Complete); a key the workflow does not declare, or a value of the wrong type, is an
/// InputError naming the key.
std::map<std::string, std::optional<expr::Value>, std::less<>> bind_arguments(const Workflow& workflow,
                                                                             const Arguments& arguments,
                                                                             Knowledge knowledge);

/// Elaborates `workflow` with `arguments`, sending each batch to `executor`. InputErrors (file:line:col):
/// an unknown or mistyped `--input`/`--param` (and, for Knowledge::Complete, an input without a value); a
/// fan-out, loop or `as` index that depends on what only the run knows; an expression that fails; a parent
/// that is not a message; an unknown agent; an out-of-range setting; passing the work bound.
Elaboration elaborate(const Workflow& workflow, const Arguments& arguments, Executor& executor,
                      Knowledge knowledge);

}  // namespace choreo::dsl::plan
