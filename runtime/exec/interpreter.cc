// Runs a workflow: static messages in one prefill batch, then each step in file order. A call with `for:`
// becomes one prefill_batch / decode_batch of its branches; names bound by `as`, `let` and `select` live in
// one global scope that expressions read, loop variables in nested scopes above it.

#include "runtime/exec/interpreter.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <span>
#include <unordered_map>

#include "dsl/budget.h"
#include "dsl/expr/evaluator.h"
#include "dsl/expr/parser.h"
#include "dsl/expr/source.h"
#include "dsl/expr/template.h"
#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "common/input_file.h"
#include "runtime/exec/calls.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/prompt_plan.h"
#include "runtime/exec/run_arguments.h"
#include "runtime/model/chat_template.h"

namespace choreo::exec {

namespace {

using dsl::expr::MapScope;
using dsl::expr::Scope;
using dsl::expr::Type;
using dsl::expr::Value;
using dsl::expr::Assignment;
using model::Token;

/// The largest index an `as` target may write (keeps a typo like `a[10**9]` from allocating a huge list).
constexpr int64_t kMaxTargetIndex = 100'000;

/// The scope of names bound so far (inputs, params, messages, `as`/`let`/`select` names); mutable by the run.
class GlobalScope : public Scope {
 public:
  std::optional<Value> lookup(std::string_view name) const override {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, value] : values_) out.push_back(name);
    return out;
  }
  /// The value bound to `name` (null when unbound), moved out so that changing it need not copy it.
  Value take(const std::string& name) {
    auto it = values_.find(name);
    return it == values_.end() ? Value() : std::move(it->second);
  }
  void set(const std::string& name, Value value) { values_[name] = std::move(value); }

 private:
  std::map<std::string, Value, std::less<>> values_;
};

std::string role_name(dsl::Role role) {
  switch (role) {
    case dsl::Role::System:
      return "system";
    case dsl::Role::User:
      return "user";
    case dsl::Role::Assistant:
      return "assistant";
    case dsl::Role::None:
      return "";
  }
  return "";
}

/// Appends the messages of a parent value (a message, or nested lists of messages) in order.
void flatten_messages(const Value& value, std::vector<dsl::expr::MessageRef>& out, bool& ok) {
  if (value.type() == Type::Message) {
    out.push_back(value.as_message());
  } else if (value.type() == Type::List) {
    for (const Value& item : value.as_list()) flatten_messages(item, out, ok);
  } else {
    ok = false;
  }
}

/// What the interpreter remembers about an encoded message.
struct MessageInfo {
  std::string name;
  std::string role;     // "" without a chat role
  std::string closing;  // role decodes: the part of the turn suffix the model did not generate
};

/// One branch of a call, ready for the engine.
struct Branch {
  std::string name;
  std::string base;
  std::vector<int64_t> indices;
  std::vector<runtime::Parent> parents;
  std::vector<std::string> parent_names;
  std::string text;  // prefill: the rendered text
  std::string role, previous_role;
  std::vector<Token> tokens;  // prefill: the message; decode: the header
  std::optional<int> new_offset;
  std::string agent;
  bool is_private = false;
  model::SamplingParams sampling;
  int max_tokens = kDefaultMaxTokens;
  std::vector<std::string> stop;
};

class Interpreter {
 public:
  Interpreter(const dsl::Workflow& workflow, CallSink& engine, const RunHooks& hooks, int64_t max_steps)
      : workflow_(workflow), engine_(engine), hooks_(hooks), vocab_(engine.model().vocab()),
        budget_(workflow, max_steps) {
    // A model without a chat template gets ChatML's turns, as llama.cpp's chat tools do.
    format_ = engine.model().chat_format();
    if (format_ == model::ChatFormat::None) format_ = model::ChatFormat::ChatML;
  }

  RunResult run(const RunArguments& arguments) {
    try {
      for (auto& [name, value] : bind_arguments(workflow_, arguments)) globals_.set(name, value);
      check_supported(workflow_.steps);
      prefill_messages();
      run_steps(workflow_.steps, globals_);
      if (workflow_.output) result_.output = render(*workflow_.output, globals_);
    } catch (...) {
      if (hooks_.on_failure) hooks_.on_failure(std::move(result_));
      throw;
    }
    return std::move(result_);
  }

 private:
  // ---- errors ----------------------------------------------------------------------------------------

  InputError error_at(const SourceLocation& where, std::string message, std::string hint = {}) const {
    return InputError(std::move(message), std::move(hint), where, workflow_.source_line(where.line));
  }

  /// Rejects what this version cannot run, before anything is computed.
  void check_supported(const std::vector<dsl::Step>& steps) const {
    for (const dsl::Step& step : steps) {
      if (const auto* call = std::get_if<dsl::Call>(&step.node)) {
        if (call->model && !is_loaded_model(call->model->value))
          throw error_at(
              call->model->where,
              fmt::format("a per-call model (`{}`) other than the loaded model is not supported yet",
                          call->model->value),
              fmt::format("the loaded model is {}", engine_.model().file().path()));
      } else if (const auto* repeat = std::get_if<dsl::Repeat>(&step.node)) {
        check_supported(repeat->steps);
      }
    }
  }

  bool is_loaded_model(const std::string& name) const {
    const std::filesystem::path loaded = engine_.model().file().path();
    if (workflow_.model && workflow_.model->value == name) return true;
    return name == loaded.string() || name == loaded.filename().string() || name == loaded.stem().string();
  }

  // ---- expressions -----------------------------------------------------------------------------------

  Value evaluate(const dsl::Text& text, const Scope& scope) const {
    return dsl::expr::evaluate(dsl::expr::parse_expression(text.value, text.where), scope);
  }

  bool condition(const dsl::Text& text, const Scope& scope) const {
    return dsl::expr::evaluate_condition(dsl::expr::parse_expression(text.value, text.where), scope);
  }

  std::string render(const dsl::Text& text, const Scope& scope) const {
    return dsl::expr::render(dsl::expr::parse_template(text.value, text.where), scope);
  }

  int64_t integer(const dsl::IntSetting& setting, const Scope& scope, std::string_view what) const {
    if (const int64_t* literal = std::get_if<int64_t>(&setting.value)) return *literal;
    const Value v = evaluate(std::get<dsl::Text>(setting.value), scope);
    if (v.type() != Type::Int)
      throw error_at(setting.where, fmt::format("`{}` must be a whole number, got {} {}", what, v.type_name(),
                                                dsl::expr::describe(v)));
    return v.as_int();
  }

  double real(const dsl::FloatSetting& setting, const Scope& scope, std::string_view what) const {
    if (const double* literal = std::get_if<double>(&setting.value)) return *literal;
    const Value v = evaluate(std::get<dsl::Text>(setting.value), scope);
    if (!v.is_number())
      throw error_at(setting.where, fmt::format("`{}` must be a number, got {} {}", what, v.type_name(),
                                                dsl::expr::describe(v)));
    return v.as_number();
  }

  int position(const dsl::IntSetting& setting, const Scope& scope, std::string_view what) const {
    const int64_t v = integer(setting, scope, what);
    if (v < 0 || v > 1'000'000'000)
      throw error_at(setting.where, fmt::format("`{}` must be a position ≥ 0, got {}", what, v));
    return int(v);
  }

  /// The elements a `NAME in EXPR` header iterates over: a list, or a dict's keys (sorted).
  std::vector<Value> iterate(const dsl::Loop& loop, const Scope& scope) const {
    const Value v = evaluate(loop.iterable, scope);
    if (v.type() == Type::List) return v.as_list();
    if (v.type() == Type::Dict) {
      std::vector<Value> keys;
      for (const auto& [key, value] : v.as_dict()) keys.push_back(Value::string(key));
      return keys;
    }
    throw error_at(
        loop.iterable.where,
        fmt::format("a loop needs a list to iterate over, got {} {}", v.type_name(), dsl::expr::describe(v)),
        "write e.g. `i in range(3)`");
  }

  /// An `agent:` / `private:` value: a template that must name a declared agent (when any are declared).
  std::string agent(const dsl::Text& text, const Scope& scope) const {
    std::string name = render(text, scope);
    if (workflow_.agents.empty()) return name;
    std::vector<std::string> declared;
    for (const dsl::Agent& a : workflow_.agents) declared.push_back(a.name.value);
    if (std::find(declared.begin(), declared.end(), name) == declared.end())
      throw error_at(text.where,
                     dsl::expr::with_suggestion(fmt::format("unknown agent `{}`", name), name, declared),
                     fmt::format("the agents are: {}", fmt::join(declared, ", ")));
    return name;
  }

  // ---- tokenisation ----------------------------------------------------------------------------------

  std::vector<Token> tokenize(const std::string& text) const { return vocab_.tokenize(text, false, true); }

  /// The closing text a role call starts with when its last parent is a role decode whose turn is open.
  std::string closing_before(const Branch& b) const {
    if (b.role.empty() || b.parents.empty()) return {};
    auto it = info_.find(b.parents.back().message);
    return it == info_.end() ? std::string() : it->second.closing;
  }

  std::string previous_role(const std::vector<runtime::Parent>& parents) const {
    if (parents.empty()) return {};
    auto it = info_.find(parents.back().message);
    return it == info_.end() ? std::string() : it->second.role;
  }

  /// A prefill's tokens: the text, wrapped in its role's turn (and after the previous turn's closing).
  std::vector<Token> message_tokens(const Branch& b) const {
    if (b.role.empty()) return tokenize(b.text);
    const model::TurnAffixes turn = model::turn_affixes_after(format_, b.role, b.previous_role);
    return tokenize(closing_before(b) + turn.prefix + model::format_content(format_, b.text) + turn.suffix);
  }

  /// A decode's header tokens: the role's turn prefix (after the previous turn's closing) and the header.
  std::vector<Token> header_tokens(const Branch& b, const std::string& header) const {
    if (b.role.empty()) return tokenize(header);
    const model::TurnAffixes turn = model::turn_affixes_after(format_, b.role, b.previous_role);
    return tokenize(closing_before(b) + turn.prefix + header);
  }

  std::string closing_after(const Branch& b, const runtime::DecodeResult& r) const {
    if (b.role.empty()) return {};
    const bool ended_on_eog = !r.generated.empty() && vocab_.is_eog(r.generated.back());
    return model::unfinished_suffix(model::turn_affixes_after(format_, b.role, b.previous_role).suffix,
                                    ended_on_eog ? vocab_.token_to_piece(r.generated.back(), true) : "");
  }

  // ---- static messages -------------------------------------------------------------------------------

  void prefill_messages() {
    std::vector<Branch> branches;
    for (const dsl::Message& m : workflow_.messages) {
      if (m.prompt) continue;  // PML prompts: after the batch, below
      Branch b;
      b.name = b.base = m.name.value;
      b.role = role_name(m.role);
      b.text = message_text(m, globals_);
      if (m.private_to) {
        b.agent = agent(*m.private_to, globals_);
        b.is_private = true;
      }
      b.tokens = message_tokens(b);
      if (b.tokens.empty()) throw error_at(m.where, fmt::format("message `{}` is empty", b.name));
      branches.push_back(std::move(b));
    }
    if (!branches.empty()) prefill(branches, "message", workflow_.messages.front().where);
    for (const dsl::Message& m : workflow_.messages)
      if (m.prompt) prefill_pml(m);
  }

  // ---- PML prompts (docs/pml.md) ----------------------------------------------------------------------

  /// A PML message: the schema's modules are encoded at their schema positions (content keys make this free
  /// when they already are), the prompt's arguments and uncached text are encoded at theirs, and the name is
  /// bound to the list of all these messages in position order. Listed as parents, they keep their schema
  /// positions (shifted together by an `at:`), so a decode over them sees exactly the prompt.
  void prefill_pml(const dsl::Message& m) {
    const std::string written = render(*m.pml, globals_);
    // The path is relative to the workflow file and must stay inside its directory (or one allowed with
    // --allow-path): a template lets a data row choose the file, and a row must not choose /etc/shadow.
    std::filesystem::path path;
    try {
      path = confine_path(workflow_.file.empty() ? "<workflow>" : workflow_.file, written, "pml: ");
    } catch (const InputError& e) {
      throw error_at(m.pml->where, e.message(), e.hint());
    }
    if (!std::filesystem::exists(path))
      throw error_at(m.pml->where, fmt::format("PML schema file '{}' does not exist", written),
                     "paths are relative to the workflow file's directory");
    auto cached = schemas_.find(path.string());
    if (cached == schemas_.end()) {
      try {
        cached = schemas_.emplace(path.string(), dsl::pml::load_schema(path.string(), nullptr, Origin::Referred)).first;
      } catch (const InputError& e) {
        // A path the data chose names a file the user never named: its errors do not quote its contents.
        if (m.pml->value.find("{{") == std::string::npos) throw;
        throw InputError(e.message(), e.hint(), e.where());
      }
    }
    const model::Model& model = engine_.model();
    // Modules this run encodes (or loads from the store) are recorded as "module" messages, so that the run's
    // end-to-end time and token counts include them; those found already encoded cost nothing and are not.
    std::map<kv::MessageId, std::pair<runtime::CallStats, double>> encoded_now;
    runtime::pml::EncodedSchema encoded = runtime::pml::encode_layout(
        [&](std::vector<runtime::PrefillRequest> requests) {
          const double start_ms = clock_ms();
          std::vector<runtime::PrefillResult> results = engine_.prefill_batch(std::move(requests));
          result_.batches.push_back({"prefill", int(results.size())});
          for (const runtime::PrefillResult& r : results)
            if (r.stats.n_computed > 0 || r.loaded) encoded_now.emplace(r.id, std::make_pair(r.stats, start_ms));
          return results;
        },
        runtime::pml::lay_out(cached->second, model));
    for (size_t piece = 0; piece < encoded.messages.size(); ++piece) {
      auto it = encoded_now.find(encoded.messages[piece]);
      if (it == encoded_now.end()) continue;
      const runtime::pml::Piece& p = encoded.layout.pieces[piece];
      Branch b;
      b.name = m.name.value + "/" +
               (p.module >= 0 ? encoded.layout.modules[size_t(p.module)].path : std::string("text")) + "#" +
               std::to_string(piece);
      MessageRecord r = record_of(b, "module", it->first, it->second.first, it->second.second);
      r.text = vocab_.detokenize(p.tokens);
      r.tokens = p.tokens;
      result_.messages.push_back(std::move(r));
      encoded_now.erase(it);
    }
    const std::string text = render(*m.prompt, globals_);
    const runtime::pml::PromptPlan plan =
        runtime::pml::plan_prompt(encoded.layout, dsl::pml::parse_prompt(text, m.prompt->where), model);

    std::vector<runtime::Parent> parents;
    dsl::expr::List refs;
    auto add = [&](kv::MessageId id, const std::string& label, int start, int n_tokens, const std::string& piece_text,
                   const runtime::CallStats& stats, const std::vector<Token>& tokens, double start_ms) {
      parents.push_back({id, start, n_tokens});
      pinned_[id] = {start, n_tokens};
      info_[id] = {m.name.value + "/" + label, "", {}};
      Branch b;
      b.name = m.name.value + "/" + label;
      MessageRecord r = record_of(b, "message", id, stats, start_ms);
      r.text = piece_text;
      r.tokens = tokens;
      result_.messages.push_back(r);
      refs.push_back(Value::message({id, piece_text}));
    };
    auto fresh = [&](const std::vector<Token>& tokens, int start) {
      runtime::PrefillRequest r;
      r.tokens = tokens;
      r.parents = parents;  // everything before it in the prompt
      r.new_offset = start;
      const double start_ms = clock_ms();
      std::vector<runtime::PrefillResult> results = engine_.prefill_batch({r});
      result_.batches.push_back({"prefill", 1});
      return std::make_pair(results.at(0), start_ms);
    };
    for (const runtime::pml::PromptPart& part : plan.parts) {
      const std::string piece_text = vocab_.detokenize(part.tokens);
      if (part.kind == runtime::pml::PromptPart::Kind::Cached) {
        runtime::CallStats stats;
        stats.start_pos = part.start_pos;
        stats.n_reused = int(part.tokens.size());
        add(encoded.messages[size_t(part.piece)], part.label, part.start_pos, int(part.tokens.size()), piece_text,
            stats, part.tokens, clock_ms());
      } else {
        auto [result, start_ms] = fresh(part.tokens, part.start_pos);
        add(result.id, part.label, part.start_pos, int(part.tokens.size()), piece_text, result.stats, part.tokens,
            start_ms);
      }
    }
    if (!plan.header.empty()) {  // the prompt's last text, which serve_prompt would decode from
      auto [result, start_ms] = fresh(plan.header, plan.header_pos);
      add(result.id, "text", plan.header_pos, int(plan.header.size()), vocab_.detokenize(plan.header), result.stats,
          plan.header, start_ms);
    }
    globals_.set(m.name.value, Value::list(std::move(refs)));
  }

  std::string message_text(const dsl::Message& m, const Scope& scope) const {
    if (m.text) return render(*m.text, scope);
    if (m.field) {
      std::optional<Value> v = scope.lookup(m.field->value);
      if (!v)
        throw error_at(
            m.field->where,
            fmt::format("dataset field `{}` has no value (datasets are not supported yet)", m.field->value),
            fmt::format("pass it with --input {}=TEXT", m.field->value));
      try {
        return dsl::expr::render_within(*v, dsl::expr::EvalLimits{}.max_string_bytes);
      } catch (const dsl::expr::ValueLimitError& e) {
        throw error_at(m.field->where, fmt::format("field `{}`: {}", m.field->value, e.message()), e.hint());
      }
    }
    throw error_at(m.where, fmt::format("message `{}` is a PML prompt; it cannot be prefilled again", m.name.value),
                   fmt::format("list `{}` as a parent instead", m.name.value));
  }

  // ---- steps -----------------------------------------------------------------------------------------

  void run_steps(const std::vector<dsl::Step>& steps, const Scope& scope) {
    for (const dsl::Step& step : steps) {
      std::visit([&](const auto& node) { run_step(node, scope); }, step.node);
    }
  }

  void run_step(const dsl::Let& let, const Scope& scope) {
    if (let.when && !condition(*let.when, scope)) return;
    for (const dsl::Binding& binding : let.bindings)
      globals_.set(binding.name.value, evaluate(binding.value, scope));
  }

  void run_step(const dsl::Select& select, const Scope& scope) {
    if (select.when && !condition(*select.when, scope)) return;
    const Value v = evaluate(select.choice, scope);
    std::vector<dsl::expr::MessageRef> refs;
    bool ok = true;
    flatten_messages(v, refs, ok);
    if (!ok || refs.empty())
      throw error_at(select.choice.where, fmt::format("`select` must pick a message, got {} {}",
                                                      v.type_name(), dsl::expr::describe(v)));
    globals_.set(select.as.value, v);
  }

  void run_step(const dsl::Repeat& repeat, const Scope& scope) {
    if (repeat.when && !condition(*repeat.when, scope)) return;
    for (const Value& element : iterate(repeat.loop, scope)) {
      budget_.iteration(repeat.loop);
      MapScope inner(&scope);
      inner.set(repeat.loop.variable.value, element);
      run_steps(repeat.steps, inner);
      if (repeat.until && condition(*repeat.until, inner)) break;
    }
  }

  void run_step(const dsl::Call& call, const Scope& scope) {
    std::vector<Branch> branches;
    if (call.for_each) {
      const std::vector<Value> elements = iterate(*call.for_each, scope);
      for (size_t i = 0; i < elements.size(); ++i) {
        budget_.iteration(*call.for_each);
        MapScope inner(&scope);
        inner.set(call.for_each->variable.value, elements[i]);
        try {
          if (call.when && !condition(*call.when, inner)) continue;
          branches.push_back(prepare(call, inner));
        } catch (const InputError& e) {
          throw e.with_message(fmt::format("in branch {} = {}: {}", call.for_each->variable.value,
                                           dsl::expr::describe(elements[i]), e.message()));
        }
      }
    } else {
      budget_.call(call);
      if (call.when && !condition(*call.when, scope)) return;
      branches.push_back(prepare(call, scope));
    }
    if (branches.empty()) return;
    if (call.kind == dsl::CallKind::Prefill)
      prefill(branches, "prefill", call.where);
    else
      decode(branches, call.where);
  }

  /// Evaluates everything one branch of a call needs: its name, parents, text or header, and settings.
  Branch prepare(const dsl::Call& call, const Scope& scope) const {
    Branch b;
    b.base = call.as.base.value;
    b.name = b.base;
    for (const dsl::Text& index : call.as.indices) {
      const Value v = evaluate(index, scope);
      if (v.type() != Type::Int || v.as_int() < 0 || v.as_int() > kMaxTargetIndex)
        throw error_at(index.where, fmt::format("an `as` index must be a whole number in [0, {}], got {}",
                                                kMaxTargetIndex, dsl::expr::describe(v)));
      b.indices.push_back(v.as_int());
      b.name += fmt::format("[{}]", v.as_int());
    }
    for (const dsl::Parent& parent : call.parents) add_parent(b, parent, scope);
    if (call.new_offset) b.new_offset = position(*call.new_offset, scope, "new_offset");
    b.previous_role = previous_role(b.parents);
    if (call.agent) b.agent = agent(*call.agent, scope);
    if (call.private_to) {
      b.is_private = true;
      const std::string owner = agent(*call.private_to, scope);
      if (b.agent.empty()) b.agent = owner;
    }

    const dsl::Message* declared = nullptr;
    if (call.message)
      for (const dsl::Message& m : workflow_.messages)
        if (m.name.value == call.message->value) declared = &m;
    b.role = role_name(call.role != dsl::Role::None || !declared ? call.role : declared->role);

    if (call.kind == dsl::CallKind::Prefill) {
      if (declared)
        b.text = message_text(*declared, scope);
      else if (call.text)
        b.text = render(*call.text, scope);
      b.tokens = message_tokens(b);
      if (b.tokens.empty()) throw error_at(call.where, fmt::format("prefill `{}` has no tokens", b.name));
    } else {
      const std::string header = call.header ? render(*call.header, scope) : std::string();
      b.text = header;
      b.tokens = header_tokens(b, header);
      if (b.tokens.empty())
        throw error_at(call.where, fmt::format("decode `{}` has an empty header", b.name),
                       "give a non-empty `header:` or a `role:`");
      sampling(b, scope, workflow_.sampling, call.sampling);
    }
    return b;
  }

  void add_parent(Branch& b, const dsl::Parent& parent, const Scope& scope) const {
    const Value v = evaluate(parent.ref, scope);
    std::vector<dsl::expr::MessageRef> refs;
    bool ok = true;
    flatten_messages(v, refs, ok);
    if (!ok)
      throw error_at(
          parent.ref.where,
          fmt::format("parent `{}` is {} {}, not a message or a list of messages", parent.ref.value,
                      v.type_name(), dsl::expr::describe(v)),
          "parents name messages: declared messages, `as` names of earlier calls, or `select` names");
    std::optional<int> offset;
    if (parent.at) offset = position(*parent.at, scope, "at");
    std::optional<int> shift;  // PML pieces keep their schema positions, moved together by an `at:`
    for (size_t i = 0; i < refs.size(); ++i) {
      auto pin = pinned_.find(kv::MessageId(refs[i].id));
      if (pin != pinned_.end()) {
        if (!shift) shift = offset ? *offset - pin->second.offset : 0;
        b.parents.push_back({kv::MessageId(refs[i].id), pin->second.offset + *shift, pin->second.n_tokens});
        b.parent_names.push_back(info_.at(kv::MessageId(refs[i].id)).name);
        continue;
      }
      // An explicit offset places the first message; the rest follow it (the engine's default rule).
      b.parents.push_back({kv::MessageId(refs[i].id), i == 0 ? offset : std::nullopt, std::nullopt});
      auto it = info_.find(kv::MessageId(refs[i].id));
      b.parent_names.push_back(it == info_.end() ? std::to_string(refs[i].id) : it->second.name);
    }
  }

  void sampling(Branch& b, const Scope& scope, const dsl::Sampling& workflow,
                const dsl::Sampling& call) const {
    b.sampling.temperature = kDefaultTemperature;
    b.sampling.top_k = kDefaultTopK;
    b.sampling.top_p = kDefaultTopP;
    b.sampling.seed = default_seed(b.name);
    for (const dsl::Sampling* s : {&workflow, &call}) {
      if (s->temperature) b.sampling.temperature = float(real(*s->temperature, scope, "temperature"));
      if (s->top_p) b.sampling.top_p = float(real(*s->top_p, scope, "top_p"));
      if (s->top_k)
        b.sampling.top_k = int(std::clamp<int64_t>(integer(*s->top_k, scope, "top_k"), 0, 1 << 30));
      if (s->max_tokens) {
        const int64_t n = integer(*s->max_tokens, scope, "max_tokens");
        if (n < 1 || n > 1'000'000)
          throw error_at(s->max_tokens->where,
                         fmt::format("`max_tokens` must be in [1, 1000000], got {}", n));
        b.max_tokens = int(n);
      }
      if (s->seed) {
        const int64_t seed = integer(*s->seed, scope, "seed");
        if (seed < 0) throw error_at(s->seed->where, fmt::format("`seed` must be at least 0, got {}", seed));
        b.sampling.seed = uint64_t(seed);
      }
      if (s->stop) {
        b.stop.clear();
        for (const dsl::Text& stop : *s->stop) b.stop.push_back(render(stop, scope));
      }
    }
    if (!(b.sampling.temperature >= 0) || !(b.sampling.top_p > 0 && b.sampling.top_p <= 1))
      throw InputError(fmt::format("decode `{}`: temperature must be ≥ 0 and top_p in (0, 1]", b.name));
  }

  // ---- engine calls ----------------------------------------------------------------------------------

  [[noreturn]] void engine_error(const std::vector<Branch>& branches, std::string_view kind,
                                 const SourceLocation& where, const InputError& e) const {
    std::vector<std::string> names;
    for (const Branch& b : branches) names.push_back(b.name);
    throw error_at(where, fmt::format("{} {}: {}", kind, fmt::join(names, ", "), e.message()), e.hint());
  }

  MessageRecord record_of(const Branch& b, std::string kind, kv::MessageId id, const runtime::CallStats& stats,
                          double start_ms) {
    MessageRecord r;
    r.name = b.name;
    r.kind = std::move(kind);
    r.id = id;
    r.agent = b.agent;
    r.is_private = b.is_private;
    r.parents = b.parent_names;
    r.start_pos = stats.start_pos;
    r.n_computed = stats.n_computed;
    r.n_reused = stats.n_reused;
    r.ttft_ms = stats.ttft_ms;
    r.total_ms = stats.total_ms;
    r.start_ms = start_ms;
    return r;
  }

  /// Binds each branch's `as` name to its message: every branch of a batch at once, so that a fan-out of n
  /// branches copies its list once, not n times.
  void bind(const std::vector<Branch>& branches, std::vector<Value> messages, const SourceLocation& where) {
    std::map<std::string, std::vector<Assignment>> by_base;
    for (size_t i = 0; i < branches.size(); ++i)
      by_base[branches[i].base].push_back({branches[i].indices, std::move(messages[i])});
    for (auto& [base, assignments] : by_base) {
      try {
        globals_.set(base, dsl::expr::assign_all(globals_.take(base), assignments));
      } catch (const dsl::expr::ValueLimitError& e) {
        throw error_at(where, fmt::format("binding `{}`: {}", base, e.message()), e.hint());
      }
    }
  }

  void prefill(const std::vector<Branch>& branches, std::string kind, const SourceLocation& where) {
    std::vector<runtime::PrefillRequest> requests;
    for (const Branch& b : branches)
      requests.push_back({b.tokens, b.parents, b.new_offset, b.agent,
                          b.is_private ? kv::Visibility::Private : kv::Visibility::Public});
    std::vector<runtime::PrefillResult> results;
    const double start_ms = clock_ms();
    try {
      results = engine_.prefill_batch(std::move(requests));
    } catch (const InputError& e) {
      engine_error(branches, kind, where, e);
    }
    result_.batches.push_back({"prefill", int(branches.size())});
    std::vector<Value> messages;
    for (size_t i = 0; i < branches.size(); ++i) {
      const Branch& b = branches[i];
      MessageRecord r = record_of(b, kind, results[i].id, results[i].stats, start_ms);
      r.text = b.text;
      r.tokens = b.tokens;
      result_.messages.push_back(r);
      info_[results[i].id] = {b.name, b.role, {}};
      messages.push_back(Value::message({results[i].id, b.text}));
    }
    bind(branches, std::move(messages), where);
  }

  void decode(const std::vector<Branch>& branches, const SourceLocation& where) {
    std::vector<runtime::DecodeRequest> requests;
    for (const Branch& b : branches) {
      runtime::DecodeRequest d;
      d.header = b.tokens;
      d.parents = b.parents;
      d.new_offset = b.new_offset;
      d.sampling = b.sampling;
      d.max_tokens = b.max_tokens;
      d.stop = b.stop;
      d.agent = b.agent;
      d.visibility = b.is_private ? kv::Visibility::Private : kv::Visibility::Public;
      if (hooks_.exact_tokens) d.exact_tokens = hooks_.exact_tokens(b.name);
      if (hooks_.record_logits) d.record_logits = hooks_.record_logits(b.name);
      if (hooks_.on_token) {
        const size_t index = requests.size();
        d.on_token = [this, index](model::Token t) { hooks_.on_token(index, t); };
      }
      requests.push_back(std::move(d));
    }
    if (hooks_.on_decode_start) {
      std::vector<DecodeBranch> started;
      for (const Branch& b : branches) started.push_back({b.name, b.agent, b.stop});
      hooks_.on_decode_start(started);
    }
    std::vector<runtime::DecodeResult> results;
    const double start_ms = clock_ms();
    try {
      results = engine_.decode_batch(std::move(requests));
    } catch (const InputError& e) {
      engine_error(branches, "decode", where, e);
    }
    result_.batches.push_back({"decode", int(branches.size())});
    std::vector<Value> messages;
    for (size_t i = 0; i < branches.size(); ++i) {
      const Branch& b = branches[i];
      const runtime::DecodeResult& d = results[i];
      MessageRecord r = record_of(b, "decode", d.id, d.stats, start_ms);
      r.text = d.text;
      r.stop_reason = d.stop_reason;
      r.logits = d.logits;
      r.n_generated = int(d.generated.size());
      r.tokens = b.tokens;
      r.tokens.insert(r.tokens.end(), d.generated.begin(), d.generated.end());
      result_.messages.push_back(r);
      info_[d.id] = {b.name, b.role, closing_after(b, d)};
      messages.push_back(Value::message({d.id, d.text}));
      if (hooks_.on_decoded) hooks_.on_decoded(r);
    }
    bind(branches, std::move(messages), where);
  }

  const dsl::Workflow& workflow_;
  CallSink& engine_;
  const RunHooks& hooks_;
  const model::Vocab& vocab_;
  model::ChatFormat format_;
  GlobalScope globals_;
  dsl::WorkBudget budget_;
  std::unordered_map<kv::MessageId, MessageInfo> info_;
  struct Pinned {
    int offset = 0;
    int n_tokens = 0;
  };
  std::unordered_map<kv::MessageId, Pinned> pinned_;  // PML pieces: where a parent list places them
  std::map<std::string, dsl::pml::Schema> schemas_;   // PML schema files by path, parsed once per run
  RunResult result_;
};

}  // namespace

double clock_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

RunResult run_workflow(const dsl::Workflow& workflow, CallSink& sink, const RunArguments& arguments,
                       const RunHooks& hooks) {
  return Interpreter(workflow, sink, hooks, arguments.max_steps).run(arguments);
}

RunResult run_workflow(const dsl::Workflow& workflow, runtime::Engine& engine, const RunArguments& arguments,
                       const RunHooks& hooks) {
  DirectSink sink(engine);
  return run_workflow(workflow, sink, arguments, hooks);
}

}  // namespace choreo::exec
