// Execution of a validated calls file: each line becomes one engine call (prefill_batch or decode_batch) and
// one JSON result line per call.

#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <ostream>
#include <span>
#include <unordered_map>

#include "runtime/exec/calls.h"
#include "runtime/model/chat_template.h"

namespace choreo::exec {

namespace {

using ordered_json = nlohmann::ordered_json;
using model::Token;

/// What later lines need to know about an executed call.
struct Executed {
  kv::MessageId message = kv::kNoMessage;
  // Text a following role turn must start with: the rest of this role decode's turn suffix that the model did
  // not generate itself (ChatML "\n" after a generated <|im_end|>, the whole suffix after a cut-off reply).
  std::string closing;
};

class Executor {
 public:
  Executor(const CallScript& script, runtime::Engine& engine, std::ostream& out)
      : script_(script), engine_(engine), vocab_(engine.model().vocab()), out_(out) {}

  void run() {
    for (const CallLine& line : script_.lines) {
      if (line.calls.front().op == CallOp::Prefill)
        prefill(line);
      else
        decode(line);
      out_.flush();
    }
  }

 private:
  std::vector<runtime::Parent> parents(const Call& call) const {
    std::vector<runtime::Parent> out;
    for (const ParentRef& p : call.parents) out.push_back({done_.at(p.ref).message, p.offset, std::nullopt});
    return out;
  }

  /// The call's tokens, preceded by the closing of the previous role decode when this call opens a new turn.
  std::vector<Token> tokens_of(const Call& call) const {
    if (call.role.empty() || call.parents.empty()) return call.tokens;
    const std::string& closing = done_.at(call.parents.back().ref).closing;
    if (closing.empty()) return call.tokens;
    std::vector<Token> out = vocab_.tokenize(closing, false, true);
    out.insert(out.end(), call.tokens.begin(), call.tokens.end());
    return out;
  }

  std::string closing_after(const Call& call, const runtime::DecodeResult& result) const {
    if (call.role.empty()) return {};
    const bool ended_on_eog = !result.generated.empty() && vocab_.is_eog(result.generated.back());
    return model::unfinished_suffix(
        model::turn_affixes_after(engine_.model().chat_format(), call.role, call.previous_role).suffix,
        ended_on_eog ? vocab_.token_to_piece(result.generated.back(), true) : "");
  }

  /// The generated tokens' pieces, a final end-of-generation token excluded, cut before the first stop
  /// string. Unlike DecodeResult::text, no leading space is dropped (SentencePiece's detokenize rule is for
  /// whole texts), so header + text is the continuation as the model wrote it.
  std::string continuation_text(const Call& call, const runtime::DecodeResult& result) const {
    std::span<const Token> visible = result.generated;
    if (!visible.empty() && vocab_.is_eog(visible.back()) && !call.exact_tokens)
      visible = visible.first(visible.size() - 1);
    std::string text;
    for (Token t : visible) text += vocab_.token_to_piece(t);
    size_t cut = std::string::npos;
    for (const std::string& s : call.stop)
      if (!s.empty()) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos) text.resize(cut);
    return text;
  }

  /// Engine errors (context overflow after long generations, cache budget spent) name the input line.
  [[noreturn]] void relocate(const CallLine& line, const InputError& e) const {
    std::vector<std::string> ids;
    for (const Call& c : line.calls) ids.push_back(c.id);
    std::string who =
        line.is_batch ? fmt::format("batch [{}]", fmt::join(ids, ", ")) : fmt::format("call '{}'", ids[0]);
    throw InputError(fmt::format("{}: {}", who, e.message()), e.hint(), {script_.name, line.line, 0});
  }

  ordered_json common(const Call& call, std::string_view op, const runtime::CallStats& stats) const {
    ordered_json j;
    j["id"] = call.id;
    j["op"] = op;
    j["line"] = call.where.line;
    j["start_pos"] = stats.start_pos;
    if (stats.n_loaded > 0 || stats.n_recomputed > 0) {  // parents brought back to T0 first (docs/store.md)
      j["n_loaded"] = stats.n_loaded;
      j["n_recomputed"] = stats.n_recomputed;
      j["load_ms"] = stats.load_ms;
    }
    if (call.model != 0) j["model"] = engine_.models()[size_t(call.model)].name;
    if (stats.n_cross_model > 0) j["n_cross_model"] = stats.n_cross_model;
    if (stats.n_repaired > 0) j["n_repaired"] = stats.n_repaired;
    return j;
  }

  void emit(const ordered_json& j) {
    out_ << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }

  void prefill(const CallLine& line) {
    std::vector<runtime::PrefillRequest> requests;
    for (const Call& c : line.calls)
      requests.push_back(
          {tokens_of(c), parents(c), c.new_offset, c.agent, c.visibility, c.model, std::nullopt, c.repair});
    std::vector<runtime::PrefillResult> results;
    try {
      results = engine_.prefill_batch(requests);
    } catch (const InputError& e) {
      relocate(line, e);
    }
    for (size_t i = 0; i < line.calls.size(); ++i) {
      const Call& call = line.calls[i];
      const runtime::PrefillResult& r = results[i];
      const std::vector<Token>& tokens = requests[i].tokens;
      ordered_json j = common(call, "prefill", r.stats);
      j["end"] = r.stats.start_pos + int(tokens.size());
      j["text"] = vocab_.detokenize(tokens, true);
      j["tokens"] = tokens;
      j["n_computed"] = r.stats.n_computed;
      j["n_reused"] = r.stats.n_reused;
      j["deduplicated"] = r.deduplicated;
      j["ttft_ms"] = r.stats.ttft_ms;
      j["total_ms"] = r.stats.total_ms;
      emit(j);
      done_[call.id] = {r.id, {}};
    }
  }

  ordered_json logprobs_json(const std::vector<runtime::TokenLogprobs>& steps) const {
    ordered_json list = ordered_json::array();
    for (const runtime::TokenLogprobs& s : steps) {
      ordered_json top = ordered_json::array();
      for (const auto& [token, logprob] : s.top)
        top.push_back({token, logprob, vocab_.token_to_piece(token, true)});
      list.push_back({{"token", s.token},
                      {"text", vocab_.token_to_piece(s.token, true)},
                      {"logprob", s.logprob},
                      {"top", std::move(top)}});
    }
    return list;
  }

  void decode(const CallLine& line) {
    std::vector<runtime::DecodeRequest> requests;
    for (const Call& c : line.calls) {
      runtime::DecodeRequest r;
      r.header = tokens_of(c);
      r.parents = parents(c);
      r.new_offset = c.new_offset;
      r.sampling = c.sampling;
      r.max_tokens = c.max_tokens;
      r.exact_tokens = c.exact_tokens;
      r.stop = c.stop;
      r.logprobs = c.logprobs;
      r.agent = c.agent;
      r.visibility = c.visibility;
      r.model = c.model;
      r.repair = c.repair;
      requests.push_back(std::move(r));
    }
    std::vector<runtime::DecodeResult> results;
    try {
      results = engine_.decode_batch(requests);
    } catch (const InputError& e) {
      relocate(line, e);
    }
    for (size_t i = 0; i < line.calls.size(); ++i) {
      const Call& call = line.calls[i];
      const runtime::DecodeResult& r = results[i];
      const std::vector<Token>& header = requests[i].header;
      ordered_json j = common(call, "decode", r.stats);
      // Choreo mode places header + generated at start_pos; the baselines recompute their whole flat prompt
      // (minus any reused prefix) from start_pos, so n_computed spans to the end there.
      j["end"] = engine_.mode() == runtime::Mode::Choreo
                     ? r.stats.start_pos + int(header.size() + r.generated.size())
                     : r.stats.start_pos + r.stats.n_computed;
      j["header"] = vocab_.detokenize(header, true);
      j["header_tokens"] = header;
      j["text"] = continuation_text(call, r);
      j["tokens"] = r.generated;
      j["stop_reason"] = r.stop_reason;
      j["n_computed"] = r.stats.n_computed;
      j["n_reused"] = r.stats.n_reused;
      j["ttft_ms"] = r.stats.ttft_ms;
      j["total_ms"] = r.stats.total_ms;
      if (call.logprobs > 0) j["logprobs"] = logprobs_json(r.logprobs);
      emit(j);
      done_[call.id] = {r.id, closing_after(call, r)};
    }
  }

  const CallScript& script_;
  runtime::Engine& engine_;
  const model::Vocab& vocab_;
  std::ostream& out_;
  std::unordered_map<std::string, Executed> done_;
};

}  // namespace

void execute_calls(const CallScript& script, runtime::Engine& engine, std::ostream& out) {
  Executor(script, engine, out).run();
}

}  // namespace choreo::exec
