// Parsing and validation of calls files (docs/exec.md). Every check that does not need the model to run
// happens here, in file order, so the first error a user sees is the first bad line.

#include "runtime/exec/calls.h"

#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <istream>
#include <limits>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "common/suggest.h"
#include "runtime/exec/json_line.h"
#include "runtime/model/chat_template.h"

namespace choreo::exec {

namespace {

using json = nlohmann::json;
using model::Token;

constexpr std::string_view kCommonFields[] = {"op",    "id",      "parents", "new_offset", "role",
                                              "agent", "private", "model",   "repair"};
constexpr std::string_view kPrefillFields[] = {"text", "tokens"};
constexpr std::string_view kDecodeFields[] = {"header", "header_tokens", "temperature",  "top_p", "top_k",
                                              "seed",   "max_tokens",    "exact_tokens", "stop",  "logprobs"};
constexpr std::string_view kOps[] = {"prefill", "decode"};
constexpr std::string_view kRoles[] = {"system", "user", "assistant"};
constexpr std::string_view kParentFields[] = {"ref", "offset"};

bool contains(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// What validation remembers about a call once its line is accepted.
struct Defined {
  int line = 0;
  CallOp op = CallOp::Prefill;
  std::string role;
  int min_tokens = 0;  // a lower bound of the message's length (a decode may generate more)
};

/// Validates calls in file order against what earlier lines defined.
class Validator {
 public:
  Validator(const std::string& name, const runtime::ModelSet& models, runtime::Mode mode, int first_pos)
      : name_(name), models_(models), model_(*models.base().weights), mode_(mode), first_pos_(first_pos),
        n_ctx_(models.n_ctx()) {}

  /// First pass: where every id appears first, so that a forward reference can say where its target is.
  void note_ids(const JsonLine& raw) {
    auto note = [&](const json& call) {
      if (call.is_object() && call.contains("id") && call["id"].is_string())
        first_line_of_.emplace(call["id"].get<std::string>(), raw.number);
    };
    if (raw.value.is_array())
      for (const json& c : raw.value) note(c);
    else
      note(raw.value);
  }

  CallLine line(const JsonLine& raw) {
    if (!raw.json_error.empty()) {
      throw InputError("invalid JSON: " + raw.json_error, "each line holds one call object or a list of them",
                       {name_, raw.number, raw.json_error_column()}, raw.text);
    }
    const std::vector<ByteRange> ranges = element_ranges(raw.text);
    CallLine out;
    out.line = raw.number;
    out.is_batch = raw.value.is_array();
    CallSite whole(name_, raw, {0, raw.text.size()}, -1);
    if (!raw.duplicate_key.empty())
      whole.fail(fmt::format("field '{}' is given twice in one object", raw.duplicate_key), {},
                 whole.key_byte(raw.duplicate_key));
    if (!out.is_batch && !raw.value.is_object())
      whole.fail(
          fmt::format("a line must hold a call object or a list of calls, not {}", type_name(raw.value)));
    if (out.is_batch && raw.value.empty())
      whole.fail("empty batch", "a batch line is a JSON list of one or more calls");
    std::unordered_set<std::string> ids_here;
    for (size_t i = 0; i < (out.is_batch ? raw.value.size() : 1); ++i) {
      const json& object = out.is_batch ? raw.value[i] : raw.value;
      CallSite site(name_, raw, i < ranges.size() ? ranges[i] : ByteRange{0, raw.text.size()},
                    out.is_batch ? int(i) : -1);
      if (!object.is_object())
        site.fail(fmt::format("a batch holds call objects, not {}", type_name(object)));
      Call call = parse_call(object, site, raw.number);
      if (out.is_batch && !out.calls.empty() && call.op != out.calls.front().op)
        site.fail(fmt::format("a batch must hold calls of one op: call #1 is a {}, this one a {}",
                              op_name(out.calls.front().op), op_name(call.op)),
                  "put prefills and decodes on separate lines", site.value_byte("op"));
      if (!ids_here.insert(call.id).second)
        site.fail(fmt::format("duplicate id '{}' in one batch", call.id), "every call needs its own id",
                  site.value_byte("id"));
      out.calls.push_back(std::move(call));
    }
    for (const Call& c : out.calls) defined_[c.id] = describe(c, out.line);
    return out;
  }

 private:
  static std::string_view op_name(CallOp op) { return op == CallOp::Prefill ? "prefill" : "decode"; }

  std::vector<Token> tokenize(std::string_view text) const {
    return model_.vocab().tokenize(text, false, true);
  }

  Call parse_call(const json& object, const CallSite& site, int line_number) {
    Fields f(object, site);
    Call call;
    call.where = site.location(site.start());
    std::optional<std::string> op = f.string("op");
    if (!op) site.fail("call has no \"op\"", "add \"op\": \"prefill\" or \"op\": \"decode\"");
    if (!contains(kOps, *op))
      f.bad_value("op", with_suggestion(fmt::format("'{}' is not an op", *op), *op, kOps),
                  "use prefill or decode");
    call.op = *op == "prefill" ? CallOp::Prefill : CallOp::Decode;
    check_field_names(object, site, call.op);

    std::optional<std::string> id = f.string("id");
    if (!id)
      site.fail("call has no \"id\"", "give every call a unique \"id\" string so later calls can name it");
    if (id->empty()) f.bad_value("id", "is empty");
    call.id = *id;
    if (auto it = defined_.find(call.id); it != defined_.end())
      f.bad_value("id", fmt::format("'{}' is already defined on line {}", call.id, it->second.line),
                  "ids name messages and must be unique in the file");

    parse_parents(object, f, site, call, line_number);
    call.new_offset = f.integer("new_offset", 0, n_ctx_);
    call.agent = f.string("agent").value_or("");
    call.visibility = f.boolean("private").value_or(false) ? kv::Visibility::Private : kv::Visibility::Public;
    if (std::optional<std::string> model = f.string("model")) {
      std::vector<std::string> names;
      for (size_t i = 0; i < models_.size(); ++i) names.push_back(models_[i].name);
      const std::optional<int> index = models_.find(*model);
      if (!index)
        f.bad_value("model", with_suggestion(fmt::format("'{}' is not a model of this run", *model), *model, names),
                    fmt::format("the models are: {} (add models with --lora-modules NAME=FILE or "
                                "--model-file NAME=FILE)",
                                fmt::join(names, ", ")));
      call.model = *index;
    }
    if (std::optional<std::string> repair = f.string("repair")) {
      try {
        call.repair = parse_repair_policy(*repair);
      } catch (const InputError& e) {
        f.bad_value("repair", e.message(), e.hint());
      }
    }
    if (std::optional<std::string> role = f.string("role")) {
      if (!contains(kRoles, *role))
        f.bad_value("role", with_suggestion(fmt::format("'{}' is not a role", *role), *role, kRoles),
                    "use system, user or assistant");
      if (model_.chat_format() == model::ChatFormat::None)
        f.bad_value("role", "needs a chat template, and this model has none",
                    "drop \"role\" and write the whole text, or use a model with a chat template");
      call.role = *role;
      if (!call.parents.empty()) {
        auto it = defined_.find(call.parents.back().ref);
        call.previous_role = it->second.role;
      }
    }
    if (call.op == CallOp::Prefill)
      parse_prefill_body(f, site, call);
    else
      parse_decode_body(f, site, call);
    check_context(f, site, call);
    return call;
  }

  void check_field_names(const json& object, const CallSite& site, CallOp op) const {
    using Names = std::span<const std::string_view>;
    const Names own = op == CallOp::Prefill ? Names(kPrefillFields) : Names(kDecodeFields);
    const Names other = op == CallOp::Prefill ? Names(kDecodeFields) : Names(kPrefillFields);
    for (auto it = object.begin(); it != object.end(); ++it) {
      const std::string& key = it.key();
      if (contains(kCommonFields, key) || contains(own, key)) continue;
      if (contains(other, key))
        site.fail(fmt::format("field '{}' belongs to {} calls, and this is a {}", key,
                              op == CallOp::Prefill ? "decode" : "prefill", op_name(op)),
                  {}, site.key_byte(key));
      std::vector<std::string_view> known(std::begin(kCommonFields), std::end(kCommonFields));
      known.insert(known.end(), own.begin(), own.end());
      site.fail(with_suggestion(fmt::format("unknown field '{}'", key), key, known),
                fmt::format("a {} takes: {}", op_name(op), fmt::join(known, ", ")), site.key_byte(key));
    }
  }

  void parse_parents(const json& object, const Fields& f, const CallSite& site, Call& call, int line_number) {
    const json* parents = f.get("parents");
    if (!parents) return;
    if (!parents->is_array())
      f.wrong_type("parents", *parents, "a list of ids or {\"ref\", \"offset\"} objects");
    size_t search_from = site.value_byte("parents");
    for (const json& p : *parents) {
      ParentRef ref;
      if (p.is_string()) {
        ref.ref = p.get<std::string>();
      } else if (p.is_object()) {
        for (auto it = p.begin(); it != p.end(); ++it)
          if (!contains(kParentFields, it.key()))
            site.fail(
                with_suggestion(fmt::format("unknown parent field '{}'", it.key()), it.key(), kParentFields),
                "a parent is \"id\" or {\"ref\": \"id\", \"offset\": N}",
                site.find(json(it.key()).dump(), search_from));
        if (!p.contains("ref") || !p["ref"].is_string())
          site.fail("a parent object needs \"ref\": the id of an earlier call", {}, search_from);
        ref.ref = p["ref"].get<std::string>();
        if (p.contains("offset") && !p["offset"].is_null()) {
          const json& off = p["offset"];
          size_t at = site.find("\"offset\"", search_from);
          if (!off.is_number_integer())
            site.fail(fmt::format("parent '{}': offset must be an integer, not {}", ref.ref, type_name(off)),
                      {}, at);
          if (!off.is_number_unsigned())
            site.fail(fmt::format("parent '{}' has negative offset {}", ref.ref, off.dump()),
                      "offsets are logical positions, 0 or more", at);
          if (off.get<uint64_t>() > uint64_t(n_ctx_))
            site.fail(fmt::format("parent '{}' has offset {}, beyond the model's context of {}", ref.ref,
                                  off.dump(), n_ctx_),
                      {}, at);
          ref.offset = off.get<int>();
        }
      } else {
        f.wrong_type("parents", p, "a list of ids or {\"ref\", \"offset\"} objects");
      }
      size_t at = site.find(json(ref.ref).dump(), search_from);
      if (at != std::string::npos) search_from = at + 1;
      check_reference(site, call, ref.ref, line_number, at);
      call.parents.push_back(std::move(ref));
    }
  }

  void check_reference(const CallSite& site, const Call& call, const std::string& ref, int line_number,
                       size_t at) const {
    if (defined_.count(ref)) return;
    if (ref == call.id)
      site.fail(fmt::format("call '{}' lists itself as a parent (a cycle)", ref),
                "a parent must be a call on an earlier line", at);
    auto later = first_line_of_.find(ref);
    if (later != first_line_of_.end() && later->second == line_number)
      site.fail(
          fmt::format(
              "parent '{}' is in the same batch; calls of a batch run together and cannot see each other",
              ref),
          "move the parent to an earlier line", at);
    if (later != first_line_of_.end())
      site.fail(fmt::format("forward reference: parent '{}' is defined on line {}, after this call (a cycle)",
                            ref, later->second),
                "a parent must be a call on an earlier line", at);
    std::vector<std::string_view> names;
    for (const auto& [id, d] : defined_) names.push_back(id);
    std::sort(names.begin(), names.end());
    site.fail(with_suggestion(fmt::format("unknown parent '{}'", ref), ref, names),
              "a parent names the id of a call on an earlier line", at);
  }

  /// The role's turn prefix and suffix for this call (empty without a role).
  model::TurnAffixes affixes(const Call& call) const {
    if (call.role.empty()) return {};
    return model::turn_affixes_after(model_.chat_format(), call.role, call.previous_role);
  }

  void parse_prefill_body(const Fields& f, const CallSite& site, Call& call) const {
    if (const json* raw = f.get("text"); raw && raw->is_string()) {
      const std::string_view content =
          model::content_in_turn(model_.chat_format(), raw->get_ref<const std::string&>());
      check_text_fits(site, call, content, "text");
    }
    std::optional<std::string> text = f.string("text");
    std::optional<std::vector<Token>> tokens = f.tokens("tokens", model_.config().n_vocab);
    if (text && tokens) site.fail("give \"text\" or \"tokens\", not both", {}, site.key_byte("tokens"));
    if (!text && !tokens) site.fail("a prefill needs \"text\" or \"tokens\"");
    const model::TurnAffixes turn = affixes(call);
    if (text) {
      call.tokens = tokenize(turn.prefix + model::format_content(model_.chat_format(), *text) + turn.suffix);
    } else {
      call.tokens = tokenize(turn.prefix);
      call.tokens.insert(call.tokens.end(), tokens->begin(), tokens->end());
      std::vector<Token> suffix = tokenize(turn.suffix);
      call.tokens.insert(call.tokens.end(), suffix.begin(), suffix.end());
    }
    if (call.tokens.empty())
      site.fail(text ? "the text is empty: a message needs at least one token" : "\"tokens\" is empty", {},
                site.value_byte(text ? "text" : "tokens"));
  }

  void parse_decode_body(const Fields& f, const CallSite& site, Call& call) const {
    const int n_vocab = model_.config().n_vocab;
    if (const json* raw = f.get("header"); raw && raw->is_string())
      check_text_fits(site, call, raw->get_ref<const std::string&>(), "header");
    std::optional<std::string> header = f.string("header");
    std::optional<std::vector<Token>> header_tokens = f.tokens("header_tokens", n_vocab);
    if (header && header_tokens)
      site.fail("give \"header\" or \"header_tokens\", not both", {}, site.key_byte("header_tokens"));
    if (!header && !header_tokens && call.role.empty())
      site.fail("a decode needs a header: the first generated token follows its last token",
                "add \"header\" (or \"header_tokens\"), or a \"role\" whose turn prefix opens the reply");
    const std::string prefix = affixes(call).prefix;
    if (header_tokens) {
      call.tokens = tokenize(prefix);
      call.tokens.insert(call.tokens.end(), header_tokens->begin(), header_tokens->end());
    } else {
      call.tokens = tokenize(prefix + header.value_or(""));
    }
    if (call.tokens.empty())
      site.fail("the header is empty: a decode needs at least one header token",
                "write the text the reply follows, e.g. \"header\": \"Answer:\"",
                site.value_byte(header_tokens ? "header_tokens" : "header"));

    call.sampling.temperature = float(f.number("temperature", 0.0, 1e6).value_or(kDefaultTemperature));
    call.sampling.top_p = float(f.number("top_p", 0.0, 1.0).value_or(kDefaultTopP));
    call.sampling.top_k = f.integer("top_k", 0, n_vocab).value_or(kDefaultTopK);
    call.sampling.seed = f.unsigned64("seed").value_or(default_seed(call.id));
    std::optional<int> max_tokens = f.integer("max_tokens", 0, std::numeric_limits<int>::max() / 2);
    call.exact_tokens = f.integer("exact_tokens", 0, std::numeric_limits<int>::max() / 2);
    if (max_tokens && call.exact_tokens)
      site.fail(
          "give \"max_tokens\" or \"exact_tokens\", not both",
          "exact_tokens generates exactly that many tokens, ignoring end of generation and stop strings",
          site.key_byte("exact_tokens"));
    call.max_tokens = max_tokens.value_or(kDefaultMaxTokens);
    call.stop = f.strings("stop").value_or(std::vector<std::string>{});
    call.logprobs = f.integer("logprobs", 0, n_vocab).value_or(0);
  }

  /// The first position of the call's own tokens, from lower bounds of every parent's length (a decode's
  /// header, or its exact length). A parent placed past the context is an error here.
  int64_t start_position(const CallSite& site, const Call& call) const {
    if (call.op == CallOp::Decode && mode_ != runtime::Mode::Choreo) {
      // The baselines re-encode BOS + the parents' tokens in list order + the header.
      int64_t start = first_pos_;
      for (const ParentRef& p : call.parents) start += defined_.at(p.ref).min_tokens;
      return start;
    }
    int64_t cursor = first_pos_, max_end = first_pos_;
    for (const ParentRef& p : call.parents) {
      const int64_t offset = p.offset.value_or(cursor);
      cursor = offset + defined_.at(p.ref).min_tokens;
      max_end = std::max(max_end, cursor);
      if (cursor > n_ctx_)
        site.fail(fmt::format("context overflow: parent '{}' placed at {} ends at {} or later, beyond the "
                              "model's context of {}",
                              p.ref, offset, cursor, n_ctx_),
                  "use smaller offsets or fewer parents", site.value_byte("parents"));
    }
    return call.new_offset.value_or(max_end);
  }

  /// Refuses `text` (what the call's `field` puts in its message) before it is copied or tokenised when even
  /// the fewest tokens it could make do not fit: a 100 MB text took gigabytes to tokenise before
  /// check_context said so.
  void check_text_fits(const CallSite& site, const Call& call, std::string_view text,
                       std::string_view field) const {
    const model::Vocab& vocab = model_.vocab();
    const int64_t at_least = int64_t(vocab.min_tokens(text));
    const int64_t start = start_position(site, call);
    if (start + at_least <= n_ctx_) return;
    site.fail(
        fmt::format("context overflow: the {} is {} bytes, so at least {} tokens (no token of this model "
                    "spells more than {} bytes), and the call starts at position {} or later, beyond the "
                    "model's context of {}",
                    field, text.size(), at_least, vocab.longest_token_bytes(), start, n_ctx_),
        call.op == CallOp::Decode ? "shorten the header, or lower new_offset or the parents' total length"
                                  : "shorten the text, or lower new_offset or the parents' total length",
        site.value_byte(field));
  }

  /// Positions are checked with lower bounds of every parent's length, so an error here is certain; longer
  /// generations can still overflow while running.
  void check_context(const Fields& f, const CallSite& site, const Call& call) const {
    const bool decode = call.op == CallOp::Decode;
    const int budget = decode ? call.exact_tokens.value_or(call.max_tokens) : 0;
    const int64_t n_new = int64_t(call.tokens.size()) + budget;
    const int64_t start = start_position(site, call);
    if (start + n_new > n_ctx_) {
      std::string what = decode ? fmt::format("{} header tokens + {} to generate", call.tokens.size(), budget)
                                : fmt::format("{} tokens", call.tokens.size());
      site.fail(
          fmt::format("context overflow: the call starts at position {} or later and needs {}, beyond the "
                      "model's context of {}",
                      start, what, n_ctx_),
          decode ? "lower max_tokens, new_offset or the parents' total length"
                 : "shorten the text, or lower new_offset or the parents' total length",
          decode && f.has(call.exact_tokens ? "exact_tokens" : "max_tokens")
              ? site.value_byte(call.exact_tokens ? "exact_tokens" : "max_tokens")
              : site.start());
    }
  }

  Defined describe(const Call& c, int line) const {
    int min_tokens = int(c.tokens.size()) + (c.op == CallOp::Decode ? c.exact_tokens.value_or(0) : 0);
    return {line, c.op, c.role, min_tokens};
  }

  const std::string& name_;
  const runtime::ModelSet& models_;
  const model::Model& model_;
  runtime::Mode mode_;
  int first_pos_;
  int n_ctx_;
  std::unordered_map<std::string, Defined> defined_;
  std::unordered_map<std::string, int> first_line_of_;
};

}  // namespace

uint64_t default_seed(std::string_view id) {
  // XXH3-64 (the hash the rest of choreo uses): stable across platforms and runs, unlike std::hash.
  return XXH3_64bits(id.data(), id.size());
}

CallScript parse_calls(std::istream& in, const std::string& name, const runtime::ModelSet& models,
                       runtime::Mode mode, int first_pos) {
  std::vector<JsonLine> raw;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines separate groups of calls
    raw.push_back(parse_json_line(number, std::move(text)));
  }
  if (in.bad()) throw RuntimeFailure(fmt::format("{}: read error", name));
  Validator validator(name, models, mode, first_pos);
  for (const JsonLine& r : raw) validator.note_ids(r);
  CallScript script;
  script.name = name;
  for (const JsonLine& r : raw) script.lines.push_back(validator.line(r));
  return script;
}

void run_calls(std::istream& in, const std::string& name, runtime::Engine& engine, std::ostream& out) {
  execute_calls(parse_calls(in, name, engine.models(), engine.mode(), engine.first_pos()), engine, out);
}

}  // namespace choreo::exec
