#include "runtime/serve/api.h"

#include <fmt/format.h>

#include "dsl/expr/value.h"
#include "runtime/serve/json_fields.h"
#include "runtime/serve/responses_api.h"

namespace choreo::serve {

using nlohmann::json;

std::string dumps(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

constexpr int kMaxChoices = 16;
constexpr size_t kMaxStops = 16;

/// A message's content: a string, or a list of text blocks joined (the part types each API names for text).
std::string content_text(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw bad(param, fmt::format("'{}' must be a string or a list of content blocks", param), "invalid_type");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content[i];
    const std::string where = fmt::format("{}[{}]", param, i);
    if (!block.is_object()) throw bad(where, fmt::format("'{}' must be a content block object", where), "invalid_type");
    const std::string type = text(block, "type", true);
    if (type != "text" && type != "input_text" && type != "output_text")
      throw bad(where + ".type", fmt::format("content blocks of type '{}' are not supported: choreo serve reads text "
                                             "(type 'text', 'input_text' or 'output_text')", type),
                "unsupported_content");
    out += text(block, "text", true);
  }
  return out;
}

std::string role_of(const json& message, const std::string& param, bool allow_system) {
  std::string role = text(message, "role", true);
  if (role == "developer") role = "system";
  if (role == "user" || role == "assistant" || (allow_system && role == "system")) return role;
  throw bad(param + ".role", fmt::format("role '{}' is not supported; use {}", role,
                                         allow_system ? "system, user or assistant" : "user or assistant"));
}

void parse_stop(const json& body, const char* name, ApiRequest& r) {
  const json* v = field(body, name);
  if (!v) return;
  if (v->is_string()) {
    r.stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array() || v->size() > kMaxStops)
    throw bad(name, fmt::format("'{}' must be a string or a list of at most {} strings", name, kMaxStops), "invalid_type");
  for (const json& s : *v) {
    if (!s.is_string()) throw bad(name, fmt::format("'{}' must hold strings only", name), "invalid_type");
    r.stop.push_back(s.get<std::string>());
  }
}

void parse_sampling(const json& body, ApiRequest& r) {
  r.sampling.temperature = float(number(body, "temperature", 0, 2, 1.0));
  r.sampling.top_p = float(number(body, "top_p", 0, 1, 1.0));
  r.sampling.top_k = int(integer(body, "top_k", 0, 1 << 20, 0));
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer() && !seed->is_number_unsigned())
      throw bad("seed", "'seed' must be an integer", "invalid_type");
    r.sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
    r.seeded = true;
  }
}

/// Who asks: prompt_cache_key, else metadata's agent/user id, else `user`.
void parse_agent(const json& body, ApiRequest& r) {
  r.agent = text(body, "prompt_cache_key", false);
  if (const json* meta = field(body, "metadata"); r.agent.empty() && meta && meta->is_object()) {
    for (const char* key : {"agent", "agent_id", "user_id"})
      if (const json* v = field(*meta, key); v && v->is_string()) {
        r.agent = v->get<std::string>();
        break;
      }
  }
  if (r.agent.empty()) r.agent = text(body, "user", false);
}

/// Adds a message to the request's prompt, and to its extension items when it has extensions (`m`: the
/// message's object, whose `choreo` object is read; null for a system prompt given apart).
void add_message(ApiRequest& r, const json* m, const std::string& param, std::string role, std::string text) {
  if (r.choreo) {
    ChoreoItem item;
    item.param = param;
    item.role = role;
    item.text = text;
    if (m) parse_message_extension(*m, param, item);
    r.choreo->items.push_back(std::move(item));
  }
  r.messages.push_back({std::move(role), std::move(text)});
}

/// Calls `each(message, param, content)` for every message of the body's list `name` after checking what the
/// APIs ask of it (a non-empty list of objects, each with content); item_reference entries become the
/// request's extension items instead.
template <typename F>
void for_each_message(const json& body, const char* name, ApiRequest& r, F each) {
  const json* messages = field(body, name);
  if (!messages) throw bad(name, fmt::format("'{}' is required", name), "missing_required_parameter");
  if (!messages->is_array() || messages->empty())
    throw bad(name, fmt::format("'{}' must be a non-empty list", name), "invalid_type");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string param = fmt::format("{}[{}]", name, i);
    if (!m.is_object()) throw bad(param, fmt::format("'{}' must be an object", param), "invalid_type");
    if (is_item_reference(m)) {
      r.choreo->items.push_back(parse_reference(m, param));  // r.choreo is set: uses_extensions saw it
      continue;
    }
    const json* content = field(m, "content");
    if (!content) throw bad(param + ".content", fmt::format("'{}.content' is required", param), "missing_required_parameter");
    each(m, param, *content);
  }
}

void parse_chat_messages(const json& body, ApiRequest& r) {
  for_each_message(body, "messages", r, [&](const json& m, const std::string& param, const json& content) {
    add_message(r, &m, param, role_of(m, param, true), content_text(content, param + ".content"));
  });
}

/// What chat completions and completions share: choices, stop strings, streaming.
void parse_openai_choices(const json& body, ApiRequest& r) {
  r.n = int(integer(body, "n", 1, kMaxChoices, 1));
  parse_stop(body, "stop", r);
  r.stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options"); so && so->is_object())
    r.include_usage = boolean(*so, "include_usage", false);
}

void parse_openai_chat(const json& body, ApiRequest& r) {
  parse_chat_messages(body, r);
  r.max_tokens = int(integer(body, "max_completion_tokens", 1, 1 << 24, integer(body, "max_tokens", 1, 1 << 24, 0)));
  parse_openai_choices(body, r);
}

void parse_completions(const json& body, ApiRequest& r) {
  const json* prompt = field(body, "prompt");
  if (!prompt) throw bad("prompt", "'prompt' is required", "missing_required_parameter");
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  if (!prompt->is_string()) throw bad("prompt", "'prompt' must be a string (or a list of one string)", "invalid_type");
  r.prompt = prompt->get<std::string>();
  r.max_tokens = int(integer(body, "max_tokens", 1, 1 << 24, 16));  // the API's default
  parse_openai_choices(body, r);
}

void parse_responses(const json& body, ApiRequest& r) {
  if (std::string instructions = text(body, "instructions", false); !instructions.empty())
    add_message(r, nullptr, "instructions", "system", instructions);
  const json* input = field(body, "input");
  if (!input) throw bad("input", "'input' is required", "missing_required_parameter");
  if (input->is_string()) {
    add_message(r, nullptr, "input", "user", input->get<std::string>());
  } else if (input->is_array()) {
    for_each_message(body, "input", r, [&](const json& item, const std::string& param, const json& content) {
      if (const json* type = field(item, "type"); type && *type != "message")
        throw bad(param + ".type", "only input items of type 'message' and 'item_reference' are supported",
                  "unsupported_content");
      add_message(r, &item, param, role_of(item, param, true), content_text(content, param + ".content"));
    });
  } else {
    throw bad("input", "'input' must be a string or a list of messages", "invalid_type");
  }
  r.max_tokens = int(integer(body, "max_output_tokens", 1, 1 << 24, 0));
  r.stream = boolean(body, "stream", false);
  if (std::string prev = text(body, "previous_response_id", false); !prev.empty()) r.previous_response_id = prev;
  r.store = boolean(body, "store", true);
}

/// Anthropic's cache_control on a block: its ttl ("5m" by default, or "1h").
std::chrono::seconds cache_ttl(const json& block, const std::string& param) {
  const json* cc = field(block, "cache_control");
  if (!cc) return std::chrono::seconds(0);
  if (!cc->is_object() || text(*cc, "type", true) != "ephemeral")
    throw bad(param + ".cache_control", "'cache_control' must be {\"type\": \"ephemeral\"} with an optional ttl");
  const std::string ttl = text(*cc, "ttl", false);
  if (ttl.empty() || ttl == "5m") return std::chrono::minutes(5);
  if (ttl == "1h") return std::chrono::hours(1);
  throw bad(param + ".cache_control.ttl", fmt::format("ttl '{}' is not one of 5m, 1h", ttl));
}

/// Anthropic content: a string, or text blocks; notes cache_control breakpoints.
std::string anthropic_content(const json& content, const std::string& param, ApiRequest& r, int message_count) {
  if (content.is_string()) return content.get<std::string>();
  std::string out = content_text(content, param);
  for (size_t i = 0; i < content.size(); ++i)
    if (const std::chrono::seconds ttl = cache_ttl(content[i], fmt::format("{}[{}]", param, i)); ttl.count() > 0) {
      r.keep_for = std::max(r.keep_for, ttl);
      r.cache_control_messages = message_count;
    }
  return out;
}

void parse_messages(const json& body, ApiRequest& r) {
  if (const json* system = field(body, "system")) {
    if (!system->is_string() && !system->is_array()) throw bad("system", "'system' must be a string or a list of text blocks", "invalid_type");
    add_message(r, nullptr, "system", "system", anthropic_content(*system, "system", r, 1));
  }
  for_each_message(body, "messages", r, [&](const json& m, const std::string& param, const json& content) {
    std::string role = role_of(m, param, false);
    add_message(r, &m, param, role, anthropic_content(content, param + ".content", r, int(r.messages.size()) + 1));
  });
  // A request-level cache_control caches the whole prompt (up to its last message).
  if (const std::chrono::seconds ttl = cache_ttl(body, "request"); ttl.count() > 0) {
    r.keep_for = std::max(r.keep_for, ttl);
    r.cache_control_messages = int(r.messages.size());
  }
  if (!field(body, "max_tokens")) throw bad("max_tokens", "'max_tokens' is required", "missing_required_parameter");
  r.max_tokens = int(integer(body, "max_tokens", 1, 1 << 24, 0));
  parse_stop(body, "stop_sequences", r);
  r.stream = boolean(body, "stream", false);
}

}  // namespace

namespace {

/// Counts a body's JSON values before any is built: nlohmann's values cost tens of bytes each (an object a map),
/// so a 16 MiB body of `[{},{},...]` would cost half a gigabyte to build. Stops at the first value past `limit`.
class ValueCounter final : public json::json_sax_t {
 public:
  explicit ValueCounter(size_t limit) : limit_(limit) {}
  bool null() override { return count(); }
  bool boolean(bool) override { return count(); }
  bool number_integer(number_integer_t) override { return count(); }
  bool number_unsigned(number_unsigned_t) override { return count(); }
  bool number_float(number_float_t, const string_t&) override { return count(); }
  bool string(string_t&) override { return count(); }
  bool binary(binary_t&) override { return count(); }
  bool start_object(std::size_t) override { return count(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return count(); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    malformed_ = true;
    return false;
  }
  bool over() const { return n_ > limit_; }
  bool malformed() const { return malformed_; }

 private:
  bool count() { return ++n_ <= limit_; }
  size_t limit_, n_ = 0;
  bool malformed_ = false;
};

ApiError invalid_json(const std::string& message) {
  return ApiError(400, "invalid_request_error", "invalid_json", message);
}

}  // namespace

json parse_body(const std::string& body) {
  if (const size_t deep = dsl::expr::find_too_deep_json(body); deep != std::string::npos)
    throw invalid_json(fmt::format("the body nests lists and objects more than {} levels deep (at byte {})",
                                   dsl::expr::kMaxValueDepth, deep + 1));
  ValueCounter counter(kMaxBodyValues);
  json::sax_parse(body, &counter, json::input_format_t::json, /*strict=*/true);
  if (counter.malformed()) throw invalid_json("the body is not valid JSON");
  if (counter.over())
    throw invalid_json(fmt::format("the body holds more than {} JSON values; no request needs that many",
                                   kMaxBodyValues));
  json v = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) throw invalid_json("the body is not valid JSON");
  if (!v.is_object()) throw invalid_json("the body must be a JSON object");
  return v;
}

namespace {

/// A field that asks for what choreo serve does not do yet (tool calls, structured output, log probabilities,
/// penalties, logit biases) is refused, never ignored: an answer that silently lacks what was asked for is worse
/// than an error. A field given with the value that asks for nothing (`logprobs: false`, a penalty of 0, an
/// empty list, `response_format: {"type": "text"}`) is accepted, as clients send those defaults.
void refuse_unimplemented(ApiKind kind, const json& body) {
  const auto refuse = [](const std::string& name, const std::string& what) {
    throw bad(name, fmt::format("'{}' is not supported by choreo serve yet ({}); leave it out", name, what),
              "unsupported_parameter");
  };
  const auto asks = [&](const char* name) -> const json* {
    const json* v = field(body, name);
    if (!v) return nullptr;
    if (v->is_boolean() && !v->get<bool>()) return nullptr;
    if (v->is_number() && v->get<double>() == 0) return nullptr;
    if ((v->is_array() || v->is_object() || v->is_string()) && v->empty()) return nullptr;
    return v;
  };
  for (const char* name : {"tools", "functions"})
    if (asks(name)) refuse(name, "tool calling");
  for (const char* name : {"tool_choice", "function_call"})
    if (const json* v = asks(name); v && !(v->is_string() && (*v == "none" || *v == "auto")) &&
                                    !(v->is_object() && (v->value("type", "") == "none" || v->value("type", "") == "auto")))
      refuse(name, "tool calling");
  if (const json* v = asks("response_format"); v && !(v->is_object() && v->value("type", "") == "text"))
    refuse("response_format", "structured output");
  if (const json* text = field(body, "text"); kind == ApiKind::Responses && text && text->is_object())
    if (const json* format = field(*text, "format"); format && !(format->is_object() && format->value("type", "") == "text"))
      refuse("text.format", "structured output");
  for (const char* name : {"logprobs", "top_logprobs"})
    if (asks(name)) refuse(name, "log probabilities");
  for (const char* name : {"frequency_penalty", "presence_penalty", "repetition_penalty"})
    if (asks(name)) refuse(name, "sampling penalties");
  if (asks("logit_bias")) refuse("logit_bias", "logit biases");
  if (kind == ApiKind::Completions) {
    if (asks("echo")) refuse("echo", "echoing the prompt");
    if (asks("suffix")) refuse("suffix", "insertion");
    if (const json* v = field(body, "best_of"); v && !(v->is_number_integer() && v->get<int64_t>() == 1))
      refuse("best_of", "best-of sampling");
  }
  if (kind == ApiKind::Messages)
    if (const json* v = field(body, "thinking"); v && v->is_object() && v->value("type", "") != "disabled")
      refuse("thinking", "extended thinking");
}

}  // namespace

ApiRequest parse_request(ApiKind kind, const json& body) {
  refuse_unimplemented(kind, body);
  ApiRequest r;
  r.kind = kind;
  r.model = text(body, "model", kind == ApiKind::Messages);
  if (uses_extensions(body, field(body, kind == ApiKind::Responses ? "input" : "messages"))) {
    if (kind == ApiKind::Completions)
      throw bad("choreo", "choreo's extensions need a message list: use /v1/chat/completions, /v1/responses or "
                          "/v1/messages",
                "unsupported_extension");
    parse_request_extension(body, r.choreo.emplace());
  }
  parse_sampling(body, r);
  parse_agent(body, r);
  r.ignore_eos = boolean(body, "ignore_eos", false);
  switch (kind) {
    case ApiKind::ChatCompletions: parse_openai_chat(body, r); break;
    case ApiKind::Completions: parse_completions(body, r); break;
    case ApiKind::Responses: parse_responses(body, r); break;
    case ApiKind::Messages: parse_messages(body, r); break;
  }
  if (r.choreo) {
    if (r.n != 1) throw bad("n", "choreo's extensions take one choice per request ('n' must be 1)", "unsupported_parameter");
    if (r.previous_response_id)
      throw bad("previous_response_id", "with choreo's extensions, name earlier messages with item_reference "
                                        "entries instead of previous_response_id",
                "unsupported_parameter");
    if (!r.choreo->agent_id.empty()) r.agent = r.choreo->agent_id;
  }
  return r;
}

std::string error_body(ApiKind kind, const ApiError& e) {
  if (kind == ApiKind::Messages)
    return dumps(json{{"type", "error"}, {"error", {{"type", e.type}, {"message", e.what()}}}});
  json error{{"message", e.what()}, {"type", e.type}, {"code", e.code}};
  error["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return dumps(json{{"error", error}});
}

json choreo_usage(const GenerationResult& result) {
  const PromptUsage& u = result.usage;
  json out{{"prompt_tokens", u.prompt_tokens},
              {"reused_prefix_tokens", u.prefix_reused},
              {"reused_out_of_prefix_tokens", u.reused_out_of_prefix},
              {"computed_tokens", u.computed},
              {"loaded_tokens", {{"t1", u.loaded_t1}, {"t2", u.loaded_t2}, {"t3", u.loaded_t3}}},
              {"recomputed_tokens", u.recomputed},
              {"ttft_ms", result.ttft_ms},
              {"total_ms", result.total_ms}};
  if (!result.message_id.empty()) out["message_id"] = result.message_id;
  if (!result.pins_refused.empty()) out["pins_refused"] = result.pins_refused;
  return out;
}

namespace {

std::string openai_finish(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

std::string anthropic_stop(const Choice& c) {
  if (c.finish_reason == "length") return "max_tokens";
  return c.stop_string.empty() ? "end_turn" : "stop_sequence";
}

json openai_usage(const GenerationResult& r) {
  return json{{"prompt_tokens", r.usage.prompt_tokens},
              {"completion_tokens", r.completion_tokens},
              {"total_tokens", r.usage.prompt_tokens + r.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", r.usage.prefix_reused}}}};
}

/// Anthropic's split of the prompt: read from the cache, written to it (up to the last cache_control
/// breakpoint), and the rest.
json anthropic_usage(const ApiRequest& request, const PromptUsage& u, int output_tokens) {
  const int creation = request.cache_control_messages > 0 ? u.computed : 0;
  return json{{"input_tokens", u.prompt_tokens - u.prefix_reused - creation},
              {"cache_read_input_tokens", u.prefix_reused},
              {"cache_creation_input_tokens", creation},
              {"output_tokens", output_tokens}};
}

std::string sse(const json& data) { return "data: " + dumps(data) + "\n\n"; }
std::string sse(const std::string& event, const json& data) {
  return "event: " + event + "\ndata: " + dumps(data) + "\n\n";
}

json chat_chunk(const Answer& a, json choices) {
  return json{{"id", a.id}, {"object", "chat.completion.chunk"}, {"created", a.created}, {"model", a.model},
              {"choices", std::move(choices)}};
}

json completion_chunk(const Answer& a, json choices) {
  return json{{"id", a.id}, {"object", "text_completion"}, {"created", a.created}, {"model", a.model},
              {"choices", std::move(choices)}};
}

}  // namespace

std::string answer_body(const ApiRequest& request, const Answer& a, const GenerationResult& result) {
  json out;
  switch (request.kind) {
    case ApiKind::ChatCompletions: {
      json choices = json::array();
      for (size_t i = 0; i < result.choices.size(); ++i)
        choices.push_back({{"index", i},
                           {"message", {{"role", "assistant"}, {"content", result.choices[i].text}}},
                           {"logprobs", nullptr},
                           {"finish_reason", openai_finish(result.choices[i].finish_reason)}});
      out = {{"id", a.id}, {"object", "chat.completion"}, {"created", a.created}, {"model", a.model},
             {"choices", choices}, {"usage", openai_usage(result)}};
      break;
    }
    case ApiKind::Completions: {
      json choices = json::array();
      for (size_t i = 0; i < result.choices.size(); ++i)
        choices.push_back({{"index", i}, {"text", result.choices[i].text}, {"logprobs", nullptr},
                           {"finish_reason", openai_finish(result.choices[i].finish_reason)}});
      out = {{"id", a.id}, {"object", "text_completion"}, {"created", a.created}, {"model", a.model},
             {"choices", choices}, {"usage", openai_usage(result)}};
      break;
    }
    case ApiKind::Responses:
      out = response_object(request, a, &result);
      break;
    case ApiKind::Messages: {
      const Choice& c = result.choices.at(0);
      out = {{"id", a.id}, {"type", "message"}, {"role", "assistant"}, {"model", a.model},
             {"content", json::array({{{"type", "text"}, {"text", c.text}}})},
             {"stop_reason", anthropic_stop(c)},
             {"stop_sequence", c.stop_string.empty() ? json(nullptr) : json(c.stop_string)},
             {"usage", anthropic_usage(request, result.usage, result.completion_tokens)}};
      break;
    }
  }
  out["choreo"] = choreo_usage(result);
  return dumps(out);
}

std::vector<std::string> stream_start(const ApiRequest& request, Answer& a, const PromptUsage& usage) {
  if (request.kind == ApiKind::Responses) return responses_stream_start(request, a);
  std::vector<std::string> events;
  if (request.kind == ApiKind::ChatCompletions) {
    for (int i = 0; i < request.n; ++i)
      events.push_back(sse(chat_chunk(a, json::array({{{"index", i},
                                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                       {"logprobs", nullptr},
                                                       {"finish_reason", nullptr}}}))));
  } else if (request.kind == ApiKind::Messages) {
    json message{{"id", a.id}, {"type", "message"}, {"role", "assistant"}, {"model", a.model},
                 {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                 {"usage", anthropic_usage(request, usage, 0)}};
    events.push_back(sse("message_start", {{"type", "message_start"}, {"message", message}}));
    events.push_back(sse("content_block_start", {{"type", "content_block_start"}, {"index", 0},
                                                 {"content_block", {{"type", "text"}, {"text", ""}}}}));
  }
  return events;
}

std::string stream_text(const ApiRequest& request, Answer& a, size_t choice, const std::string& text) {
  switch (request.kind) {
    case ApiKind::ChatCompletions:
      return sse(chat_chunk(a, json::array({{{"index", choice}, {"delta", {{"content", text}}},
                                             {"logprobs", nullptr}, {"finish_reason", nullptr}}})));
    case ApiKind::Completions:
      return sse(completion_chunk(a, json::array({{{"index", choice}, {"text", text}, {"logprobs", nullptr},
                                                   {"finish_reason", nullptr}}})));
    case ApiKind::Messages:
      return sse("content_block_delta", {{"type", "content_block_delta"}, {"index", 0},
                                         {"delta", {{"type", "text_delta"}, {"text", text}}}});
    case ApiKind::Responses: return responses_stream_text(a, text);
  }
  return {};
}

std::vector<std::string> stream_end(const ApiRequest& request, Answer& a, const GenerationResult& result) {
  if (request.kind == ApiKind::Responses) return responses_stream_end(request, a, result);
  std::vector<std::string> events;
  if (request.kind == ApiKind::Messages) {
    const Choice& c = result.choices.at(0);
    events.push_back(sse("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}));
    events.push_back(sse("message_delta", {{"type", "message_delta"},
                                           {"delta", {{"stop_reason", anthropic_stop(c)},
                                                      {"stop_sequence", c.stop_string.empty() ? json(nullptr) : json(c.stop_string)}}},
                                           {"usage", {{"output_tokens", result.completion_tokens}}}}));
    events.push_back(sse("message_stop", {{"type", "message_stop"}}));
    return events;
  }
  const bool chat = request.kind == ApiKind::ChatCompletions;
  for (size_t i = 0; i < result.choices.size(); ++i) {
    json choice{{"index", i}, {"logprobs", nullptr}, {"finish_reason", openai_finish(result.choices[i].finish_reason)}};
    if (chat) choice["delta"] = json::object();
    else choice["text"] = "";
    events.push_back(sse(chat ? chat_chunk(a, json::array({choice})) : completion_chunk(a, json::array({choice}))));
  }
  if (request.include_usage) {
    json last = chat ? chat_chunk(a, json::array()) : completion_chunk(a, json::array());
    last["usage"] = openai_usage(result);
    last["choreo"] = choreo_usage(result);
    events.push_back(sse(last));
  }
  events.push_back("data: [DONE]\n\n");
  return events;
}

std::string stream_error(const ApiRequest& request, Answer& a, const ApiError& e) {
  if (request.kind == ApiKind::Responses) return responses_stream_error(a, e);
  if (request.kind == ApiKind::Messages) return sse("error", json::parse(error_body(request.kind, e)));
  return sse(json::parse(error_body(request.kind, e)));
}

}  // namespace choreo::serve
