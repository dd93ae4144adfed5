#include "runtime/serve/responses_api.h"

namespace choreo::serve {

using nlohmann::json;

namespace {

json output_text(const std::string& text) {
  return json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

json message_item(const Answer& a, const std::string& status, json content) {
  return json{{"type", "message"},
              {"id", a.message_id},
              {"status", status},
              {"role", "assistant"},
              {"content", std::move(content)}};
}

/// One event of the stream: `type` with `fields`, numbered.
std::string event(Answer& a, const std::string& type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = a.sequence++;
  return "event: " + type + "\ndata: " + dumps(fields) + "\n\n";
}

json at_text(const Answer& a) {
  return json{{"item_id", a.message_id}, {"output_index", 0}, {"content_index", 0}};
}

}  // namespace

json response_object(const ApiRequest& request, const Answer& a, const GenerationResult* result) {
  const Choice* c = result ? &result->choices.at(0) : nullptr;
  json out{{"id", a.id},
           {"object", "response"},
           {"created_at", a.created},
           {"model", a.model},
           {"status", !c                             ? "in_progress"
                      : c->finish_reason == "length" ? "incomplete"
                                                     : "completed"},
           {"output", c ? json::array({message_item(a, "completed", json::array({output_text(c->text)}))})
                        : json::array()},
           {"previous_response_id", a.previous_response_id ? json(*a.previous_response_id) : json(nullptr)},
           {"store", request.store},
           {"usage", nullptr}};
  if (!result) return out;
  out["usage"] = {{"input_tokens", result->usage.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", result->usage.prefix_reused}}},
                  {"output_tokens", result->completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", result->usage.prompt_tokens + result->completion_tokens}};
  if (c->finish_reason == "length") out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  out["choreo"] = choreo_usage(*result);
  return out;
}

std::vector<std::string> responses_stream_start(const ApiRequest& request, Answer& a) {
  const json response = response_object(request, a, nullptr);
  json part = at_text(a);
  part["part"] = output_text("");
  return {event(a, "response.created", {{"response", response}}),
          event(a, "response.in_progress", {{"response", response}}),
          event(a, "response.output_item.added",
                {{"output_index", 0}, {"item", message_item(a, "in_progress", json::array())}}),
          event(a, "response.content_part.added", part)};
}

std::string responses_stream_text(Answer& a, const std::string& text) {
  json delta = at_text(a);
  delta["delta"] = text;
  delta["logprobs"] = json::array();
  return event(a, "response.output_text.delta", delta);
}

std::vector<std::string> responses_stream_end(const ApiRequest& request, Answer& a,
                                              const GenerationResult& result) {
  const std::string& text = result.choices.at(0).text;
  json done = at_text(a);
  done["text"] = text;
  done["logprobs"] = json::array();
  json part = at_text(a);
  part["part"] = output_text(text);
  return {
      event(a, "response.output_text.done", done), event(a, "response.content_part.done", part),
      event(a, "response.output_item.done",
            {{"output_index", 0}, {"item", message_item(a, "completed", json::array({output_text(text)}))}}),
      // A response cut at max_output_tokens ends with response.incomplete, as OpenAI's do.
      event(a, result.choices.at(0).finish_reason == "length" ? "response.incomplete" : "response.completed",
            {{"response", response_object(request, a, &result)}})};
}

std::string responses_stream_error(Answer& a, const ApiError& e) {
  return event(
      a, "error",
      {{"code", e.code}, {"message", e.what()}, {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
}

}  // namespace choreo::serve
