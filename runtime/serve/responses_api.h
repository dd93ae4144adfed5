#pragma once
// OpenAI's Responses API shapes (`/v1/responses`): the response object, whole or as its event stream
// (response.created, response.in_progress, response.output_item.added, response.content_part.added, then
// response.output_text.delta per piece of text, then the .done events and response.completed, or
// response.incomplete when max_output_tokens cut it). Each event carries the next sequence number of its
// stream. Used by api.cc, which dispatches on the API.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/serve/api.h"

namespace choreo::serve {

/// The response object: in progress (no result yet: no output, no usage) or done.
nlohmann::json response_object(const ApiRequest& request, const Answer& answer,
                               const GenerationResult* result);

std::vector<std::string> responses_stream_start(const ApiRequest& request, Answer& answer);
std::string responses_stream_text(Answer& answer, const std::string& text);
std::vector<std::string> responses_stream_end(const ApiRequest& request, Answer& answer,
                                              const GenerationResult& result);
std::string responses_stream_error(Answer& answer, const ApiError& e);

}  // namespace choreo::serve
