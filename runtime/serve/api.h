#pragma once
// The request bodies of the OpenAI (chat completions, completions, responses) and Anthropic (messages) HTTP
// APIs as one generation request, and the answers in each API's shape, whole or as server-sent events. Field
// names and shapes follow the public API references; docs/serve.md lists what is read and what is ignored.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/model/chat_template.h"
#include "runtime/model/sampler.h"
#include "runtime/serve/choreo_request.h"
#include "runtime/serve/request.h"

namespace choreo::serve {

enum class ApiKind { ChatCompletions, Completions, Responses, Messages };

/// A generation request, whatever API it came through.
struct ApiRequest {
  ApiKind kind = ApiKind::ChatCompletions;
  std::string model;                          // as the client named it ("" when it named none)
  std::vector<model::ChatMessage> messages;   // chat: the system turn first when there is one
  std::string prompt;                         // completions: the raw prompt
  model::SamplingParams sampling;
  bool seeded = false;                        // the client gave a seed
  int max_tokens = 0;                         // <= 0: up to the context
  std::vector<std::string> stop;
  int n = 1;
  bool ignore_eos = false;                    // llama.cpp's extension: never draw end-of-generation
  bool stream = false;
  bool include_usage = false;                 // stream_options.include_usage
  std::string agent;                          // prompt_cache_key, metadata, a session header: for the log
  std::chrono::seconds keep_for{0};           // cache_control ttl: keep the prompt's sessions this long
  int cache_control_messages = 0;             // Anthropic: messages up to the last cache_control breakpoint
  std::optional<std::string> previous_response_id;  // responses
  bool store = true;                                // responses
  /// choreo's extensions (runtime/serve/choreo_request.h): set when the request uses any. Its items are the
  /// prompt then (`messages` holds the messages among them).
  std::optional<ChoreoRequest> choreo;
};

/// Parses a request body of `kind` (a JSON object). ApiError 400 names the field that is wrong.
ApiRequest parse_request(ApiKind kind, const nlohmann::json& body);

/// The most JSON values a request body may hold (each costs tens of bytes once built; a long chat or an
/// extension request with thousands of messages holds tens of thousands).
inline constexpr size_t kMaxBodyValues = size_t(1) << 19;

/// Parses the body's JSON: ApiError 400 for malformed JSON, a value nested too deep, more than kMaxBodyValues
/// values (counted before any is built), or not an object.
nlohmann::json parse_body(const std::string& body);

/// The error body of `kind`'s API for `e`.
std::string error_body(ApiKind kind, const ApiError& e);

/// Names the request's answer in its API's shape.
struct Answer {
  std::string id;           // chatcmpl-…, cmpl-…, resp_…, msg_…
  std::string model;        // as listed by /v1/models
  int64_t created = 0;      // unix seconds
  std::optional<std::string> previous_response_id;
  std::string message_id;   // responses: the output message's id (with extensions, the answer's choreo id)
  int sequence = 0;         // responses streams: the next event's sequence number
};

/// The whole answer of a request that did not stream.
std::string answer_body(const ApiRequest& request, const Answer& answer, const GenerationResult& result);

/// The events of a streamed answer, each a complete server-sent event ("data: …\n\n", Anthropic's with
/// "event: …").
std::vector<std::string> stream_start(const ApiRequest& request, Answer& answer, const PromptUsage& usage);
std::string stream_text(const ApiRequest& request, Answer& answer, size_t choice, const std::string& text);
std::vector<std::string> stream_end(const ApiRequest& request, Answer& answer, const GenerationResult& result);
/// An error after the stream began.
std::string stream_error(const ApiRequest& request, Answer& answer, const ApiError& e);

/// JSON text; bytes that are not UTF-8 (a model may generate them) become U+FFFD.
std::string dumps(const nlohmann::json& v);

/// The choreo object of a response: where the prompt's tokens came from.
nlohmann::json choreo_usage(const GenerationResult& result);

}  // namespace choreo::serve
