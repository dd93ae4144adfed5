#pragma once
// What `choreo serve` answers a generation, whatever HTTP API the request came through (runtime/serve/api.h), and
// the errors it answers with. docs/serve.md describes the mapping for users.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kv/message_store.h"
#include "runtime/model/sampler.h"

namespace choreo::serve {

/// An error a request gets back as `{"error": {"message", "type", "code"}}` with an HTTP status, so that the
/// SDKs raise their own exception classes (400 BadRequest, 401 Authentication, 404 NotFound, 409 Conflict,
/// 413, 429 RateLimit, 503).
struct ApiError : std::runtime_error {
  int status;
  std::string type;  // invalid_request_error, authentication_error, not_found_error, ...
  std::string code;  // a machine-readable reason, e.g. message_not_found
  std::string param;
  ApiError(int status_, std::string type_, std::string code_, const std::string& message, std::string param_ = {})
      : std::runtime_error(message), status(status_), type(std::move(type_)), code(std::move(code_)),
        param(std::move(param_)) {}
};

/// How a generation decodes, whatever its prompt.
struct GenerationSettings {
  int model = 0;  // which of the engine's models
  model::SamplingParams sampling;
  int max_tokens = 0;  // <= 0: up to the context length
  std::vector<std::string> stop;
  bool ignore_eos = false;  // end-of-generation never ends it (llama.cpp's ignore_eos)
};

/// One choice of a generation.
struct Choice {
  std::string text;
  std::string finish_reason;  // stop, length, cancelled
  std::string stop_string;    // the stop string it ended at, if any
  int n_generated = 0;
  kv::MessageId message = kv::kNoMessage;  // the answer's message (header and generated tokens)
};

/// Token counts of a request's prompt.
struct PromptUsage {
  int prompt_tokens = 0;        // every token the model sees before generating (BOS excluded)
  int prefix_reused = 0;        // found encoded in this place already: a prefix-cache hit
  int reused_out_of_prefix = 0; // item_reference parents: encoded elsewhere, read here (not a prefix hit)
  int computed = 0;             // encoded for this request (the header included)
  int loaded_t1 = 0, loaded_t2 = 0, loaded_t3 = 0;  // of those reused, brought back from a lower tier
  int recomputed = 0;           // of those reused, recomputed because no tier held them
};

/// What a generation gave.
struct GenerationResult {
  std::vector<Choice> choices;
  PromptUsage usage;
  int completion_tokens = 0;
  double ttft_ms = 0, total_ms = 0;
  std::string response_id;  // set when the request is stored for a later previous_response_id
  std::string message_id;   // choreo's extensions: the answer's id, which later requests can name
  std::vector<std::string> pins_refused;  // choreo's extensions: messages whose pins the budget refused
};

}  // namespace choreo::serve
