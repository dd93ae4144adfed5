#include "runtime/serve/server.h"

#include <chrono>
#include <cstring>
#include <random>
#include <strings.h>

#include <fmt/format.h>
#include <sodium.h>

#include "common/error.h"
#include "common/utf8.h"
#include "runtime/exec/interpreter.h"

namespace choreo::serve {

using nlohmann::json;

namespace {

/// How often a request's thread looks at its client while the answer is made.
constexpr std::chrono::milliseconds kClientPoll{100};
/// The status logged for a request whose client left before its answer was written (nginx's).
constexpr int kClientClosedRequest = 499;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Compares in time independent of where the strings differ (an API key).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

void send_json(HttpResponder& r, int status, const std::string& body) { r.send(status, "application/json", body); }

/// An error answer; a 429 says when to retry (Retry-After, as RFC 6585 suggests and the SDKs read).
void send_error(HttpResponder& r, ApiKind kind, const ApiError& e) {
  std::map<std::string, std::string> headers;
  if (e.status == 429) headers["Retry-After"] = "1";
  r.send(e.status, "application/json", error_body(kind, e), headers);
}

/// 405 for a route that takes other methods, with the Allow header RFC 9110 asks for.
void method_not_allowed(HttpResponder& r, ApiKind kind, const std::string& allow, const std::string& what) {
  r.send(405, "application/json",
         error_body(kind, ApiError(405, "invalid_request_error", "method_not_allowed", "use " + allow + " " + what)),
         {{"Allow", allow}});
}

/// The client of a request whose answer is being made. Looked at between waits (without reading or blocking),
/// it cancels the generation once the client has closed its side or a write to it failed: the generation's
/// choices stop before their next token, and the request is logged 499 (nginx's "client closed request").
class ClientWatch {
 public:
  ClientWatch(HttpResponder& responder, Generation& g) : responder_(responder), g_(g) {}
  /// Looks at the client; true once it is gone.
  bool look() {
    if (!gone_ && responder_.client_gone()) lost();
    return gone_;
  }
  /// The client is gone (a write to it failed).
  void lost() {
    gone_ = true;
    g_.cancel();
  }
  bool gone() const { return gone_; }
  /// Waits for the prompt's evaluation (or the end), looking at the client meanwhile.
  void until_admitted() {
    while (!g_.admitted_within(kClientPoll)) look();
  }
  /// Waits for the end, looking at the client meanwhile (a non-streamed answer has nothing to write till then).
  void until_ended() {
    while (!g_.ended_within(kClientPoll)) look();
  }
  /// Generation::next, looking at the client whenever no text came for a while.
  bool next(std::vector<TextEvent>* events) {
    bool polled = false;
    while (g_.next_for(events, kClientPoll, &polled)) {
      if (!polled) return true;
      look();
    }
    return false;
  }

 private:
  HttpResponder& responder_;
  Generation& g_;
  bool gone_ = false;
};

}  // namespace

/// A log line's text with every control character (C0, DEL, C1), line or paragraph separator, bidirectional
/// override or isolate, and byte that is not UTF-8 shown as '?', so that a client can neither forge log lines
/// nor make one read differently on a terminal (U+202E reverses what follows).
std::string printable(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_utf8_length(s, i);
    if (n == 0) {  // not UTF-8
      out += '?';
      ++i;
      continue;
    }
    const auto byte = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[i + k])); };
    uint32_t cp = n == 1 ? byte(0) : byte(0) & (0x7fu >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (byte(k) & 0x3f);
    const bool hidden = cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
                        (cp >= 0x200e && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) ||
                        (cp >= 0x2066 && cp <= 0x2069) || cp == 0x061c;
    if (hidden) out += '?';
    else out.append(s, i, n);
    i += n;
  }
  return out;
}

Server::Server(std::unique_ptr<runtime::OpenedEngine> engine, std::vector<std::string> model_ids, ServeOptions options)
    : options_(std::move(options)), model_ids_(std::move(model_ids)), service_(std::move(engine), options_.extensions),
      stored_(options_.max_stored_responses, options_.max_stored_bytes) {
  if (::sodium_init() < 0) throw RuntimeFailure("cannot initialise libsodium (ids are drawn from its CSPRNG)");
}

std::string Server::new_id(const char* prefix) {
  // 128 bits from the operating system's CSPRNG: an id names a stored conversation or a message, so one
  // client must not be able to guess another's (previous_response_id) or take it first (a 409 for the other).
  unsigned char bytes[16];
  ::randombytes_buf(bytes, sizeof bytes);
  std::string id = prefix;
  for (unsigned char b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

bool Server::authorized(const HttpRequest& request) const {
  if (options_.api_key.empty()) return true;
  std::string given = request.header("x-api-key");
  if (given.empty()) {
    // RFC 9110: the scheme is case-insensitive ("bearer" is "Bearer"), with one or more spaces after it.
    const std::string auth = request.header("authorization");
    if (auth.size() > 6 && strncasecmp(auth.c_str(), "bearer", 6) == 0 && (auth[6] == ' ' || auth[6] == '\t'))
      if (const size_t key = auth.find_first_not_of(" \t", 6); key != std::string::npos) given = auth.substr(key);
  }
  return !given.empty() && same_secret(given, options_.api_key);
}

int Server::resolve_model(const std::string& id) const {
  if (id.empty()) return 0;
  for (size_t i = 0; i < model_ids_.size(); ++i)
    if (model_ids_[i] == id) return int(i);
  std::string known;
  for (const std::string& m : model_ids_) known += (known.empty() ? "" : ", ") + m;
  throw ApiError(404, "invalid_request_error", "model_not_found",
                 fmt::format("the model '{}' does not exist on this server; it serves: {}", id, known), "model");
}

std::string Server::gauges() {
  const EngineService::Snapshot s = service_.snapshot();
  return fmt::format(
      "# HELP choreo_t0_bytes KV bytes held in T0 (the page pool) and its budget.\n"
      "# TYPE choreo_t0_bytes gauge\n"
      "choreo_t0_bytes{{kind=\"in_use\"}} {}\n"
      "choreo_t0_bytes{{kind=\"budget\"}} {}\n"
      "# HELP choreo_sessions Cached KV sessions of plain requests.\n"
      "# TYPE choreo_sessions gauge\n"
      "choreo_sessions {}\n"
      "# HELP choreo_session_events_total What the session cache did: prompts that extended a session, copied "
      "a prefix, and sessions dropped for room.\n"
      "# TYPE choreo_session_events_total counter\n"
      "choreo_session_events_total{{event=\"extended\"}} {}\n"
      "choreo_session_events_total{{event=\"copied\"}} {}\n"
      "choreo_session_events_total{{event=\"dropped\"}} {}\n"
      "# HELP choreo_decode_steps_total Continuous-batching decode steps, and the choices they decoded.\n"
      "# TYPE choreo_decode_steps_total counter\n"
      "choreo_decode_steps_total {}\n"
      "choreo_decode_rows_total {}\n"
      "# HELP choreo_requests_in_flight Generations admitted and not yet answered.\n"
      "# TYPE choreo_requests_in_flight gauge\n"
      "choreo_requests_in_flight {}\n",
      s.t0_in_use_bytes, s.t0_budget_bytes, s.sessions, s.cache.extended, s.cache.copied, s.cache.dropped,
      s.plain.steps, s.plain.step_rows, in_flight_.load()) + extension_gauges(s) +
      render_tiers(s.tiers, s.t1_in_use_bytes, s.t1_budget_bytes);
}

std::string Server::extension_gauges(const EngineService::Snapshot& s) {
  const ExtensionStats& e = s.extensions;
  return fmt::format(
      "# HELP choreo_extension_groups_total Groups of requests with choreo's extensions run together.\n"
      "# TYPE choreo_extension_groups_total counter\n"
      "choreo_extension_groups_total {}\n"
      "# HELP choreo_extension_batches_total Engine batches of those groups (prefill waves and decodes), and the "
      "calls in them.\n"
      "# TYPE choreo_extension_batches_total counter\n"
      "choreo_extension_batches_total{{op=\"prefill\"}} {}\n"
      "choreo_extension_batches_total{{op=\"decode\"}} {}\n"
      "choreo_extension_calls_total{{op=\"prefill\"}} {}\n"
      "choreo_extension_calls_total{{op=\"decode\"}} {}\n"
      "choreo_extension_deferred_total {}\n"
      "# HELP choreo_message_names Message names (choreo.id, output ids) the server keeps.\n"
      "# TYPE choreo_message_names gauge\n"
      "choreo_message_names {}\n"
      "# HELP choreo_pinned_bytes T0 bytes held by pins whose leases run, and the pins granted, refused and "
      "expired.\n"
      "# TYPE choreo_pinned_bytes gauge\n"
      "choreo_pinned_bytes {}\n"
      "choreo_pins_total{{event=\"granted\"}} {}\n"
      "choreo_pins_total{{event=\"refused\"}} {}\n"
      "choreo_pins_total{{event=\"expired\"}} {}\n",
      e.groups, e.prefill_batches, e.decode_batches, e.prefills, e.decodes, e.deferred, s.names, s.pinned_bytes,
      s.hints.pins_granted, s.hints.pins_refused, s.hints.pins_expired);
}

void Server::handle(const HttpRequest& request, HttpResponder& r) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  // HEAD is GET without the body (the HTTP layer leaves the body out).
  const bool get = request.method == "GET" || request.method == "HEAD", post = request.method == "POST";
  struct Route {
    const char* path;
    ApiKind kind;
  };
  static const Route routes[] = {{"/v1/chat/completions", ApiKind::ChatCompletions},
                                 {"/v1/completions", ApiKind::Completions},
                                 {"/v1/responses", ApiKind::Responses},
                                 {"/v1/messages", ApiKind::Messages}};
  for (const Route& route : routes) {
    if (path != route.path) continue;
    if (!post) {
      method_not_allowed(r, route.kind, "POST", "for " + path);
      return metrics_.request(path, 405);
    }
    return generation(route.kind, path, request, r);
  }
  static const std::string workflows = "/choreo/v1/workflows";
  if (path.rfind(workflows + "/", 0) == 0 && path.size() > workflows.size() + 1) {
    const int status = post ? workflow(path.substr(workflows.size() + 1), request, r) : 405;
    if (!post) method_not_allowed(r, ApiKind::ChatCompletions, "POST", "to run a workflow");
    return metrics_.request(workflows, status);
  }
  int status = 200;
  const bool get_route = path == "/health" || path == "/v1/models" || path == workflows || path == "/metrics";
  if (get_route && !get) {
    status = 405;
    method_not_allowed(r, ApiKind::ChatCompletions, "GET, HEAD", "for " + path);
  } else if (get && path == "/health") {
    send_json(r, 200, R"({"status":"ok"})");
  } else if (!authorized(request) && get_route) {  // every GET route but /health, answered above
    status = 401;
    send_json(r, 401, error_body(ApiKind::ChatCompletions,
                                 ApiError(401, "authentication_error", "invalid_api_key", "a valid API key is required")));
  } else if (get && path == "/v1/models") {
    json data = json::array();
    for (const std::string& id : model_ids_)
      data.push_back({{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "choreo"}});
    send_json(r, 200, dumps(json{{"object", "list"}, {"data", data}}));
  } else if (get && path == workflows) {
    send_json(r, 200, dumps(json{{"object", "list"}, {"data", options_.workflows.names}}));
  } else if (get && path == "/metrics" && options_.metrics) {
    r.send(200, "text/plain; version=0.0.4", metrics_.render(gauges()));
  } else {
    status = 404;
    send_json(r, 404, error_body(ApiKind::ChatCompletions,
                                 ApiError(404, "invalid_request_error", "not_found",
                                          fmt::format("no route for {} {}", printable(request.method), printable(path)))));
  }
  metrics_.request(status == 404 ? "other" : path, status);
}

Server::InFlight Server::admit(const HttpRequest& request, ApiKind kind) {
  if (!authorized(request))
    throw ApiError(401, "authentication_error", "invalid_api_key",
                   "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)");
  InFlight guard(in_flight_);
  if (guard.admitted() > options_.max_concurrency)
    throw ApiError(429, kind == ApiKind::Messages ? "rate_limit_error" : "rate_limit_exceeded", "too_many_requests",
                   fmt::format("the server runs at most {} generations at once (--max-concurrency); retry later",
                               options_.max_concurrency));
  return guard;
}

void Server::generation(ApiKind kind, const std::string& endpoint, const HttpRequest& request, HttpResponder& r) {
  int status = 200;
  try {
    const InFlight guard = admit(request, kind);
    ApiRequest api = parse_request(kind, parse_body(request.body));
    const int model = resolve_model(api.model);
    if (api.agent.empty()) api.agent = request.header("x-choreo-agent");
    if (api.agent.empty()) api.agent = request.header("x-session-id");
    run_generation(api, model, r, endpoint);
    return;
  } catch (const ApiError& e) {
    status = e.status;
    if (!r.sent()) send_error(r, kind, e);
  } catch (const InputError& e) {
    status = 400;
    if (!r.sent())
      send_json(r, 400, error_body(kind, ApiError(400, "invalid_request_error", "invalid_request", e.what())));
  } catch (const std::exception& e) {
    status = 500;
    if (!r.sent()) send_json(r, 500, error_body(kind, ApiError(500, "server_error", "internal", e.what())));
  }
  metrics_.request(endpoint, status);
  if (options_.log_requests)
    std::fprintf(options_.log, "serve: %s %s -> %d\n", request.method.c_str(), endpoint.c_str(), status);
}

int Server::workflow(const std::string& name, const HttpRequest& request, HttpResponder& r) {
  const ApiKind errors = ApiKind::ChatCompletions;  // OpenAI's error shape
  try {
    const InFlight guard = admit(request, errors);
    const json body = parse_body(request.body);
    if (!options_.workflows.run)
      throw ApiError(404, "invalid_request_error", "workflow_not_found",
                     "this server runs no workflows (start it with --workflows DIR)");
    const auto stream_field = body.find("stream");
    if (stream_field != body.end() && !stream_field->is_boolean())
      throw ApiError(400, "invalid_request_error", "invalid_type", "'stream' must be true or false", "stream");
    const bool stream = stream_field == body.end() || stream_field->get<bool>();
    // The run is a job on the engine thread (it runs alone there); its text comes back through a generation.
    // It stops before its next token once its client is gone or it passed --workflow-timeout.
    auto g = std::make_shared<Generation>();
    auto record = std::make_shared<nlohmann::ordered_json>();
    auto timed_out = std::make_shared<std::atomic<bool>>(false);
    const auto deadline = std::chrono::steady_clock::now() + options_.workflow_timeout;
    service_.post([g, record, name, body, timed_out, deadline, run = options_.workflows.run](runtime::Engine& engine) {
      const auto cancelled = [&] {
        if (!timed_out->load() && std::chrono::steady_clock::now() >= deadline) *timed_out = true;
        return g->cancelled() || timed_out->load();
      };
      try {
        *record = run(name, body, engine, [&] { g->admitted({}); }, [&](std::string text) { g->emit(0, std::move(text)); },
                      cancelled);
        g->finish({});
      } catch (...) {
        g->fail(std::current_exception());
      }
    });
    ClientWatch client(r, *g);
    client.until_admitted();
    std::string text;
    std::vector<TextEvent> events;
    bool open = true;
    try {
      g->wait_admitted();  // errors before the run starts are plain HTTP errors
      if (stream) r.begin_stream(200, "text/event-stream");
      while (client.next(&events)) {
        for (const TextEvent& e : events) {
          if (!stream) text += e.text;
          else if (open) open = r.write("event: text\ndata: " + dumps(json{{"text", e.text}}) + "\n\n");
        }
        if (!open && !client.gone()) client.lost();
      }
      g->wait();
    } catch (const exec::RunCancelled&) {
      if (!timed_out->load() || client.gone()) {
        log_workflow(name, kClientClosedRequest);
        return kClientClosedRequest;
      }
      const ApiError e(503, "server_error", "workflow_timeout",
                       fmt::format("the workflow run passed the server's bound of {} s (--workflow-timeout) and was "
                                   "stopped",
                                   options_.workflow_timeout.count()));
      if (stream && open) r.write("event: error\ndata: " + error_body(errors, e) + "\n\n");
      throw e;
    } catch (const ApiError& e) {
      if (stream && open) r.write("event: error\ndata: " + error_body(errors, e) + "\n\n");
      throw;
    }
    if (client.gone()) {
      log_workflow(name, kClientClosedRequest);
      return kClientClosedRequest;
    }
    if (stream)
      r.write("event: result\ndata: " + record->dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
    else
      send_json(r, 200, nlohmann::ordered_json{{"text", text}, {"record", *record}}.dump(
                            -1, ' ', false, json::error_handler_t::replace));
    log_workflow(name, 200);
    return 200;
  } catch (const ApiError& e) {
    if (!r.sent()) send_error(r, errors, e);
    log_workflow(name, e.status);
    return e.status;
  } catch (const std::exception& e) {
    if (!r.sent()) send_json(r, 500, error_body(errors, ApiError(500, "server_error", "internal", e.what())));
    return 500;
  }
}

std::vector<model::Token> Server::prompt_tokens(ApiRequest& api, int model) {
  const model::Model& weights = *service_.models()[size_t(model)].weights;
  if (api.kind == ApiKind::Completions) return weights.vocab().tokenize(api.prompt, true, /*parse_special=*/true);
  if (api.previous_response_id) {
    std::lock_guard lock(stored_mutex_);
    const Stored* stored = stored_.find(*api.previous_response_id);
    if (!stored)
      throw ApiError(404, "invalid_request_error", "previous_response_not_found",
                     fmt::format("no stored response '{}' (it was never stored, or the server restarted or dropped it)",
                                 *api.previous_response_id),
                     "previous_response_id");
    const size_t system = !api.messages.empty() && api.messages[0].role == "system" ? 1 : 0;
    api.messages.insert(api.messages.begin() + ptrdiff_t(system), stored->messages.begin(), stored->messages.end());
  }
  if (weights.chat_format() == model::ChatFormat::None)
    throw ApiError(400, "invalid_request_error", "no_chat_template",
                   "this model has no chat template choreo knows; use /v1/completions with a raw prompt");
  return weights.vocab().tokenize(model::render_chat(weights.chat_format(), api.messages, true), true, true);
}

GenerationSettings Server::settings(const ApiRequest& api, int model) {
  GenerationSettings s;
  s.model = model;
  s.sampling = api.sampling;
  s.max_tokens = api.max_tokens;
  s.stop = api.stop;
  s.ignore_eos = api.ignore_eos;
  return s;
}

std::shared_ptr<Generation> Server::start_plain(ApiRequest& api, int model) {
  PlainRequest plain;
  static_cast<GenerationSettings&>(plain) = settings(api, model);
  plain.prompt = prompt_tokens(api, model);
  plain.n = api.n;
  plain.keep_for = api.keep_for;
  auto g = std::make_shared<PlainGeneration>(std::move(plain));
  service_.start(g);
  return g;
}

std::shared_ptr<Generation> Server::start_extension(ApiRequest& api, int model) {
  ExtensionRequest e;
  static_cast<GenerationSettings&>(e) = settings(api, model);
  e.ext = std::move(*api.choreo);
  api.choreo.reset();
  e.agent = api.agent;
  auto g = std::make_shared<ExtensionGeneration>(std::move(e));
  service_.start(g);
  return g;
}

void Server::run_generation(ApiRequest& api, int model, HttpResponder& r, const std::string& endpoint) {
  if (!api.seeded) api.sampling.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  const bool extended = api.choreo.has_value();
  const char* prefix = api.kind == ApiKind::ChatCompletions ? "chatcmpl-"
                       : api.kind == ApiKind::Completions   ? "cmpl-"
                       : api.kind == ApiKind::Responses     ? "resp_"
                                                            : "msg_";
  Answer answer{new_id(prefix), model_ids_[size_t(model)], unix_seconds(), api.previous_response_id};
  // The answer's message id: with extensions, the name later requests give it (the client's output_id, or one
  // made here); /v1/responses shows it as the output message's id.
  if (extended && api.choreo->output_id.empty()) api.choreo->output_id = new_id("msg_");
  answer.message_id = extended ? api.choreo->output_id : "msg_" + answer.id.substr(std::strlen(prefix));
  const std::shared_ptr<Generation> g = extended ? start_extension(api, model) : start_plain(api, model);
  GenerationResult result;
  ClientWatch client(r, *g);
  if (!api.stream) {
    client.until_ended();
    result = g->wait();
    if (!client.gone()) send_json(r, 200, answer_body(api, answer, result));
  } else {
    client.until_admitted();
    const PromptUsage usage = g->wait_admitted();  // errors before any event are plain HTTP errors
    r.begin_stream(200, "text/event-stream");
    bool open = !client.gone();
    for (const std::string& e : stream_start(api, answer, usage)) open = open && r.write(e);
    std::vector<TextEvent> events;
    while (client.next(&events)) {
      for (const TextEvent& e : events)
        if (open) open = r.write(stream_text(api, answer, e.choice, e.text));
      if (!open && !client.gone()) client.lost();
    }
    open = open && !client.gone();
    try {
      result = g->wait();
    } catch (const ApiError& e) {
      if (open) r.write(stream_error(api, answer, e));
      throw;
    }
    if (open)
      for (const std::string& e : stream_end(api, answer, result)) open = open && r.write(e);
    if (!open && !client.gone()) client.lost();
  }
  const bool gone = client.gone();
  const int status = gone ? kClientClosedRequest : 200;
  if (api.kind == ApiKind::Responses && api.store && !extended && !gone) {
    Stored s;
    s.model = model;
    const size_t system = !api.messages.empty() && api.messages[0].role == "system" ? 1 : 0;
    s.messages.assign(api.messages.begin() + ptrdiff_t(system), api.messages.end());
    s.messages.push_back({"assistant", result.choices.at(0).text});
    size_t bytes = 0;
    for (const model::ChatMessage& m : s.messages) bytes += sizeof m + m.role.size() + m.content.size();
    std::lock_guard lock(stored_mutex_);
    stored_.put(answer.id, std::move(s), bytes);
  }
  metrics_.request(endpoint, status);
  metrics_.generation(result.usage, result.completion_tokens, result.ttft_ms / 1000, result.total_ms / 1000);
  log_line(answer.id, api, result, status);
}

void Server::log_workflow(const std::string& name, int status) {
  if (!options_.log_requests) return;
  std::fprintf(options_.log, "serve: workflow %s status=%d\n", printable(name).c_str(), status);
  std::fflush(options_.log);
}

void Server::log_line(const std::string& id, const ApiRequest& api, const GenerationResult& result, int status) {
  if (!options_.log_requests) return;
  std::fprintf(options_.log,
               "serve: %s agent=%s status=%d prompt=%d computed=%d reused=%d loaded=%d generated=%d ttft=%.1fms "
               "total=%.1fms\n",
               id.c_str(), api.agent.empty() ? "-" : printable(api.agent).c_str(), status, result.usage.prompt_tokens,
               result.usage.computed, result.usage.prefix_reused + result.usage.reused_out_of_prefix,
               result.usage.loaded_t1 + result.usage.loaded_t2 + result.usage.loaded_t3, result.completion_tokens,
               result.ttft_ms, result.total_ms);
  std::fflush(options_.log);
}

}  // namespace choreo::serve
