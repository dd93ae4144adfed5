// Runs a workflow (docs/workflow-language.md, "How a workflow runs"). The run compiles the workflow's plan
// with its own arguments, then elaborates the workflow with the same elaborator the plan came from
// (dsl/plan/elaborate.h) knowing every value; this file is the elaborator's executor: it checks each batch
// against the plan (plan_follower.h), turns its branches into engine requests (tokens in chat turns, PML
// layouts, sampling defaults), runs them and hands back the messages they made.

#include "runtime/exec/interpreter.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "dsl/expr/value.h"
#include "dsl/plan/elaborate.h"
#include "dsl/plan/steps_to_execution.h"
#include "common/clock.h"
#include "runtime/exec/calls.h"
#include "runtime/exec/plan_follower.h"
#include "runtime/model/chat_template.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/prompt_plan.h"
#include "runtime/pml/serve.h"

namespace choreo::exec {

namespace {

using dsl::expr::Type;
using dsl::expr::Value;
using dsl::plan::NodeKind;
using model::Token;

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

/// Appends the message ids in a value the executor returned (a message, or a PML message's pieces).
void message_ids(const Value& value, std::vector<kv::MessageId>& out) {
  if (value.type() == Type::Message) {
    out.push_back(kv::MessageId(value.as_message().id));
  } else if (value.type() == Type::List) {
    for (const Value& item : value.as_list()) message_ids(item, out);
  }
}

/// What the interpreter remembers about an encoded message.
struct MessageInfo {
  std::string name;
  std::string role;     // "" without a chat role
  std::string closing;  // role decodes: the part of the turn suffix the model did not generate
};

/// One branch of a batch, ready for the engine.
struct Branch {
  std::string name;
  std::vector<runtime::Parent> parents;
  std::vector<std::string> parent_names;
  std::string text;  // prefill: the rendered text
  std::string role, previous_role;
  std::vector<Token> tokens;  // prefill: the message; decode: the header
  std::optional<int> new_offset;
  std::string agent;
  bool is_private = false;
  int model = 0;           // the engine's model it runs on
  std::vector<int> read_by;  // the models of the calls that read it or anything made over it (the plan's)
  std::string model_name;  // its name, "" for the run's model
  std::optional<RepairPolicy> repair;  // `repair:` (the call's, else the workflow's)
  model::SamplingParams sampling;
  int max_tokens = kDefaultMaxTokens;
  std::vector<std::string> stop;
};

/// A run's steps-to-execution, as the engine asks for them (runtime/engine/step_oracle.h): its plan's step
/// clock, and which plan node each of its messages is. Queried from the engine's thread, advanced from the
/// run's.
class RunSteps final : public runtime::StepOracle {
 public:
  RunSteps(const dsl::plan::Plan& plan, const PlanFollower& follower) : clock_(plan), follower_(follower) {}

  std::optional<size_t> steps_to_execution(kv::MessageId message) const override {
    std::lock_guard lock(mutex_);
    // A message that is several plan nodes (identical encodings) is needed as soon as any of them is.
    std::optional<size_t> best;
    for (size_t node : follower_.nodes_of(message))
      if (std::optional<size_t> s = clock_.for_message(node)) best = best ? std::min(*best, *s) : *s;
    return best;
  }

  std::optional<kv::Retention> retention(kv::MessageId message) const override {
    // The plan does not change while the run lasts; the follower guards its own map.
    std::optional<kv::Retention> out;
    for (size_t node : follower_.nodes_of(message)) {
      const dsl::Retention& r = follower_.plan().nodes[node].retention;
      if (!r.any()) continue;
      kv::Retention k{r.pin, int(r.priority), std::nullopt, r.release};
      if (r.ttl_s) k.ttl_ms = double(*r.ttl_s) * 1000.0;
      out = out ? kv::merged(*out, k) : k;
    }
    return out;
  }

  /// Completes `step` and returns every agent's new value.
  StepSample complete(std::optional<size_t> step) {
    std::lock_guard lock(mutex_);
    if (step) clock_.complete(*step);
    StepSample sample;
    sample.ms = steady_ms();
    sample.completed = step;
    for (const std::string& agent : clock_.agents()) sample.agents.emplace_back(agent, clock_.for_agent(agent));
    return sample;
  }

 private:
  mutable std::mutex mutex_;
  dsl::plan::StepClock clock_;
  const PlanFollower& follower_;
};

/// Registers a run's oracle with the engine for as long as the run lasts.
class Registration {
 public:
  Registration(runtime::StepOracleRegistry& registry, const runtime::StepOracle& oracle)
      : registry_(registry), oracle_(oracle) {
    registry_.add(&oracle_);
  }
  ~Registration() { registry_.remove(&oracle_); }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  runtime::StepOracleRegistry& registry_;
  const runtime::StepOracle& oracle_;
};

class Interpreter : public dsl::plan::Executor {
 public:
  Interpreter(const dsl::Workflow& workflow, CallSink& engine, const RunHooks& hooks)
      : workflow_(workflow), engine_(engine), hooks_(hooks), vocab_(engine.model().vocab()) {
    // A model without a chat template gets ChatML's turns, as llama.cpp's chat tools do.
    format_ = engine.model().chat_format();
    if (format_ == model::ChatFormat::None) format_ = model::ChatFormat::ChatML;
  }

  RunResult run(const RunArguments& arguments) {
    try {
      // The plan of exactly this run: every batch below must be one of its steps.
      plan_ = dsl::plan::compile(workflow_, arguments);
      follower_.emplace(plan_);
      check_models();
      read_by_ = readers_of_nodes();
      steps_.emplace(plan_, *follower_);
      Registration registration(engine_.step_oracles(), *steps_);
      result_.steps.push_back(steps_->complete(std::nullopt));
      if (hooks_.on_plan) hooks_.on_plan(plan_);
      dsl::plan::Elaboration e =
          dsl::plan::elaborate(workflow_, arguments, *this, dsl::plan::Knowledge::Complete);
      if (e.output) result_.output = std::move(*e.output);
    } catch (...) {
      if (hooks_.on_failure) hooks_.on_failure(std::move(result_));
      throw;
    }
    return std::move(result_);
  }

  std::vector<Value> execute(NodeKind kind, std::vector<dsl::plan::Branch>& branches,
                             const SourceLocation& where) override {
    const size_t step = follower_->match(kind, branches);
    const std::vector<size_t> nodes = follower_->nodes();
    std::vector<Value> values(branches.size());
    if (kind == NodeKind::Message) {
      // Declared messages in one batch; PML prompts after it, one by one.
      std::vector<Branch> plain;
      std::vector<size_t> at;
      for (size_t i = 0; i < branches.size(); ++i) {
        if (branches[i].message->prompt) continue;
        plain.push_back(prepare(branches[i], nodes[i]));
        at.push_back(i);
      }
      if (!plain.empty()) {
        std::vector<Value> made = prefill(plain, "message", where);
        for (size_t k = 0; k < at.size(); ++k) values[at[k]] = std::move(made[k]);
      }
      for (size_t i = 0; i < branches.size(); ++i)
        if (branches[i].message->prompt) values[i] = prefill_pml(branches[i], nodes[i]);
    } else {
      std::vector<Branch> prepared;
      for (size_t i = 0; i < branches.size(); ++i) prepared.push_back(prepare(branches[i], nodes[i]));
      values = kind == NodeKind::Prefill ? prefill(prepared, "prefill", where) : decode(prepared, where);
    }
    std::vector<kv::MessageId> created;
    for (size_t i = 0; i < values.size(); ++i) {
      const size_t first = created.size();
      message_ids(values[i], created);
      for (size_t k = first; k < created.size(); ++k) follower_->created(created[k], nodes[i]);
    }
    result_.steps.push_back(steps_->complete(step));
    if (hooks_.on_plan_batch) hooks_.on_plan_batch(step, created);
    return values;
  }

 private:
  // ---- errors ----------------------------------------------------------------------------------------

  InputError error_at(const SourceLocation& where, std::string message, std::string hint = {}) const {
    return InputError(std::move(message), std::move(hint), where, workflow_.source_line(where.line));
  }

  /// Every model a call of the plan names is one the engine has, before anything is computed.
  void check_models() const {
    for (const dsl::plan::Node& n : plan_.nodes)
      if (n.model) model_index(*n.model);
  }

  /// For each plan node, the engine models of the calls that read it or anything made over it (ascending):
  /// an E cache is saved only for the cross-model plans those reads go through (DESIGN.md §6). Nodes come
  /// after their parents, so one pass from the last node back gathers them.
  std::vector<std::vector<int>> readers_of_nodes() const {
    std::vector<std::vector<int>> readers(plan_.nodes.size());
    for (size_t c = plan_.nodes.size(); c-- > 0;) {
      const dsl::plan::Node& n = plan_.nodes[c];
      const int model = n.model ? model_index(*n.model) : 0;
      for (const dsl::plan::Edge& e : n.parents) {
        std::vector<int>& r = readers.at(e.parent);
        r.push_back(model);
        r.insert(r.end(), readers[c].begin(), readers[c].end());
        std::sort(r.begin(), r.end());
        r.erase(std::unique(r.begin(), r.end()), r.end());
      }
    }
    return readers;
  }

  /// The engine's index of a `model:` name (`default`: the run's model, index 0).
  int model_index(const dsl::Text& name) const {
    if (name.value == "default") return 0;
    if (std::optional<int> i = engine_.models().find(name.value)) return *i;
    throw error_at(name.where, fmt::format("model `{}` is not loaded", name.value),
                   "`choreo run`, `choreo profile` and `choreo eval` load the models a workflow declares under "
                   "`models:`; the engine running this workflow was made without them");
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

  // ---- PML prompts (docs/pml.md) ----------------------------------------------------------------------

  /// A PML message: the schema's modules are encoded at their schema positions (content keys make this free
  /// when they already are), the prompt's arguments and uncached text are encoded at theirs, and the name is
  /// bound to the list of all these messages in position order. Listed as parents, they keep their schema
  /// positions (shifted together by an `at:`), so a decode over them sees exactly the prompt.
  Value prefill_pml(const dsl::plan::Branch& branch, size_t plan_node) {
    const dsl::Message& m = *branch.message;
    const model::Model& model = engine_.model();
    // Modules this run encodes (or loads from the store) are recorded as "module" messages, so that the run's
    // end-to-end time and token counts include them; those found already encoded cost nothing and are not.
    std::map<kv::MessageId, std::pair<runtime::CallStats, double>> encoded_now;
    const auto prefill = [&](std::vector<runtime::PrefillRequest> requests, bool modules) {
      stop_if_cancelled();
      for (runtime::PrefillRequest& r : requests) r.read_by = read_by_.at(plan_node);
      const double start_ms = steady_ms();
      std::vector<runtime::PrefillResult> results = engine_.prefill_batch(std::move(requests));
      result_.batches.push_back({"prefill", int(results.size())});
      if (modules)
        for (const runtime::PrefillResult& r : results)
          if (r.stats.n_computed > 0 || r.loaded) encoded_now.emplace(r.id, std::make_pair(r.stats, start_ms));
      return results;
    };
    const runtime::pml::EncodedSchema encoded = runtime::pml::encode_layout(
        [&](std::vector<runtime::PrefillRequest> r) { return prefill(std::move(r), true); },
        runtime::pml::lay_out(*branch.pml.schema, model), engine_.models().n_ctx());
    record_modules(m, encoded, encoded_now);
    // The prompt's parts at their positions; its closing text too (which serve_prompt would decode from).
    const runtime::pml::EncodedPrompt prompt = runtime::pml::encode_prompt(
        [&](std::vector<runtime::PrefillRequest> r) { return prefill(std::move(r), false); }, encoded,
        *branch.pml.prompt, model, /*closing_text=*/true);
    dsl::expr::List refs;
    for (const runtime::pml::PromptPiece& piece : prompt.pieces) {
      runtime::CallStats stats;
      if (piece.encoded) {
        stats = piece.encoded->stats;
      } else {
        stats.start_pos = piece.start_pos;
        stats.n_reused = int(piece.tokens.size());
      }
      const std::string piece_text = vocab_.detokenize(piece.tokens);
      pinned_[piece.id] = {piece.start_pos, int(piece.tokens.size())};
      info_[piece.id] = {m.name.value + "/" + piece.label, "", {}};
      Branch b;
      b.name = m.name.value + "/" + piece.label;
      MessageRecord r = record_of(b, "message", piece.id, stats, piece.start_ms);
      r.text = piece_text;
      r.tokens = piece.tokens;
      result_.messages.push_back(r);
      refs.push_back(Value::message({piece.id, piece_text}));
    }
    return Value::list(std::move(refs));
  }

  /// The schema pieces this run encoded (or loaded from a store) for a PML message, as "module" messages.
  void record_modules(const dsl::Message& m, const runtime::pml::EncodedSchema& encoded,
                      std::map<kv::MessageId, std::pair<runtime::CallStats, double>>& encoded_now) {
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
  }

  // ---- branches -------------------------------------------------------------------------------------

  /// Where a parent goes: a PML piece keeps its schema position (its entry's pieces shifted together by an
  /// `at:`); any other message at its entry's `at:` when it is the entry's first, else after the one before.
  void add_parents(Branch& b, const dsl::plan::Node& node, const dsl::plan::Node& planned) const {
    std::vector<size_t> named;  // plan nodes already named among the parents
    const SourceLocation* entry = nullptr;
    std::optional<int64_t> entry_at;
    std::optional<int> shift;
    for (const dsl::plan::Edge& e : node.parents) {
      if (!entry || e.where.line != entry->line || e.where.col != entry->col) {
        entry = &e.where;
        entry_at = e.at;
        shift.reset();
      }
      const kv::MessageId id = kv::MessageId(e.parent);
      auto pin = pinned_.find(id);
      if (pin != pinned_.end()) {
        if (!shift) shift = entry_at ? int(*entry_at) - pin->second.offset : 0;
        b.parents.push_back({id, pin->second.offset + *shift, pin->second.n_tokens});
      } else {
        b.parents.push_back({id, e.at ? std::optional<int>(int(*e.at)) : std::nullopt, std::nullopt});
      }
      b.parent_names.push_back(parent_name(id, planned, named));
    }
  }

  /// A parent's name as the call names it. Identical encodings share one message, so one id can be several
  /// plan nodes (`doc[0]` and `doc[2]` with the same text): the one the call's plan node reads is its name.
  std::string parent_name(kv::MessageId id, const dsl::plan::Node& planned, std::vector<size_t>& named) const {
    const std::vector<size_t> nodes = follower_->nodes_of(id);
    if (nodes.size() > 1)
      for (size_t node : nodes) {
        const bool read = std::any_of(planned.parents.begin(), planned.parents.end(),
                                      [&](const dsl::plan::Edge& e) { return e.parent == node; });
        if (read && !plan_.nodes[node].pml && std::find(named.begin(), named.end(), node) == named.end()) {
          named.push_back(node);
          return plan_.nodes[node].name;
        }
      }
    auto it = info_.find(id);
    return it == info_.end() ? std::to_string(id) : it->second.name;
  }

  /// Everything the engine needs for one elaborated branch: parents, tokens, sampling.
  Branch prepare(const dsl::plan::Branch& src, size_t plan_node) const {
    const dsl::plan::Node& n = src.node;
    Branch b;
    b.name = n.name;
    b.role = role_name(src.role);
    add_parents(b, n, plan_.nodes[plan_node]);
    if (n.new_offset) b.new_offset = int(*n.new_offset);
    b.previous_role = previous_role(b.parents);
    b.agent = n.agent;
    b.is_private = !n.private_to.empty();
    b.read_by = read_by_.at(plan_node);
    b.repair = n.repair;
    if (n.model && n.model->value != "default") {
      b.model = model_index(*n.model);
      b.model_name = n.model->value;
    }
    if (n.kind != NodeKind::Decode) {
      b.text = n.text.value();
      b.tokens = message_tokens(b);
      if (b.tokens.empty()) {
        if (n.kind == NodeKind::Message) throw error_at(src.message->where, fmt::format("message `{}` is empty", b.name));
        throw error_at(n.where, fmt::format("prefill `{}` has no tokens", b.name));
      }
      return b;
    }
    b.text = src.header.value();
    b.tokens = header_tokens(b, b.text);
    if (b.tokens.empty())
      throw error_at(n.where, fmt::format("decode `{}` has an empty header", b.name),
                     "give a non-empty `header:` or a `role:`");
    const dsl::plan::SamplingValues& s = src.sampling;
    b.sampling.temperature = s.temperature ? float(*s.temperature) : kDefaultTemperature;
    b.sampling.top_p = s.top_p ? float(*s.top_p) : kDefaultTopP;
    b.sampling.top_k = s.top_k ? int(std::clamp<int64_t>(*s.top_k, 0, 1 << 30)) : kDefaultTopK;
    b.sampling.seed = s.seed ? uint64_t(*s.seed) : default_seed(b.name);
    if (s.max_tokens) b.max_tokens = int(*s.max_tokens);
    if (s.stop) b.stop = *s.stop;
    return b;
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
    for (const runtime::Parent& p : b.parents) r.parent_at.push_back(p.offset);
    r.start_pos = stats.start_pos;
    r.n_computed = stats.n_computed;
    r.n_reused = stats.n_reused;
    r.n_loaded = stats.n_loaded;
    r.n_recomputed = stats.n_recomputed;
    r.n_cross_model = stats.n_cross_model;
    r.n_repaired = stats.n_repaired;
    r.model = b.model_name;
    r.load_ms = stats.load_ms;
    r.ttft_ms = stats.ttft_ms;
    r.total_ms = stats.total_ms;
    r.start_ms = start_ms;
    return r;
  }

  /// RunHooks::cancelled: the run ends before its next engine batch.
  void stop_if_cancelled() const {
    if (hooks_.cancelled && hooks_.cancelled()) throw RunCancelled();
  }

  std::vector<Value> prefill(const std::vector<Branch>& branches, std::string kind, const SourceLocation& where) {
    stop_if_cancelled();
    std::vector<runtime::PrefillRequest> requests;
    for (const Branch& b : branches)
      requests.push_back({b.tokens, b.parents, b.new_offset, b.agent,
                          b.is_private ? kv::Visibility::Private : kv::Visibility::Public, b.model, b.read_by,
                          b.repair});
    std::vector<runtime::PrefillResult> results;
    const double start_ms = steady_ms();
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
    return messages;
  }

  std::vector<Value> decode(const std::vector<Branch>& branches, const SourceLocation& where) {
    stop_if_cancelled();
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
      d.model = b.model;
      d.read_by = b.read_by;
      d.repair = b.repair;
      if (hooks_.cancelled) d.cancelled = hooks_.cancelled;
      if (hooks_.exact_tokens) d.exact_tokens = hooks_.exact_tokens(b.name);
      if (hooks_.record_logits) d.record_logits = hooks_.record_logits(b.name);
      if (hooks_.sampling) hooks_.sampling(b.name, d.sampling);
      if (hooks_.forced_tokens)
        if (std::optional<std::vector<model::Token>> forced = hooks_.forced_tokens(b.name)) {
          if (forced->size() > size_t(b.max_tokens))
            throw InputError(fmt::format("teacher forcing: decode '{}' is given {} tokens, more than its "
                                         "max_tokens of {}",
                                         b.name, forced->size(), b.max_tokens),
                             "the tokens must come from a run of this workflow", where);
          d.forced = std::move(*forced);
          d.max_tokens = int(d.forced.size());
        }
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
    const double start_ms = steady_ms();
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
      r.logits = std::move(results[i].logits);  // moved, not copied: a vocabulary of floats per token
      r.n_generated = int(d.generated.size());
      r.tokens = b.tokens;
      r.tokens.insert(r.tokens.end(), d.generated.begin(), d.generated.end());
      info_[d.id] = {b.name, b.role, closing_after(b, d)};
      messages.push_back(Value::message({d.id, d.text}));
      if (hooks_.on_decoded) hooks_.on_decoded(r);
      result_.messages.push_back(std::move(r));
    }
    return messages;
  }

  const dsl::Workflow& workflow_;
  CallSink& engine_;
  const RunHooks& hooks_;
  const model::Vocab& vocab_;
  model::ChatFormat format_;
  dsl::plan::Plan plan_;
  std::optional<PlanFollower> follower_;
  std::vector<std::vector<int>> read_by_;  // per plan node (readers_of_nodes)
  std::optional<RunSteps> steps_;
  std::unordered_map<kv::MessageId, MessageInfo> info_;
  struct Pinned {
    int offset = 0;
    int n_tokens = 0;
  };
  std::unordered_map<kv::MessageId, Pinned> pinned_;  // PML pieces: where a parent list places them
  RunResult result_;
};

}  // namespace

RunResult run_workflow(const dsl::Workflow& workflow, CallSink& sink, const RunArguments& arguments,
                       const RunHooks& hooks) {
  return Interpreter(workflow, sink, hooks).run(arguments);
}

RunResult run_workflow(const dsl::Workflow& workflow, runtime::Engine& engine, const RunArguments& arguments,
                       const RunHooks& hooks) {
  DirectSink sink(engine);
  return run_workflow(workflow, sink, arguments, hooks);
}

}  // namespace choreo::exec
