// choreo's request extensions as `choreo serve` parses them (runtime/serve/choreo_request.h, api.h) and what
// its clients' hints tell the KV tiers (runtime/serve/serve_hints.h): the message list keeps item_reference
// entries in their places beside the messages; every field of the choreo objects is checked and named in its
// error; a pin is a lease within a byte budget; a message's steps to execution are the least its readers'
// agents have in their workflow's latest `next`.

#include <doctest/doctest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/serve/api.h"
#include "runtime/serve/serve_hints.h"

namespace choreo {
namespace {

using nlohmann::json;
using serve::ApiError;
using serve::ApiKind;

/// The ApiError a body gets.
ApiError error_of(ApiKind kind, const json& body) {
  try {
    serve::parse_request(kind, body);
  } catch (const ApiError& e) {
    return e;
  }
  FAIL("the body was accepted: ", body.dump());
  return ApiError(0, "", "", "");
}

TEST_CASE(
    "serve extensions: item_reference entries keep their places among the messages, with each message's id") {
  const json body = json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief.", "choreo": {"id": "sys", "retention": {"pin": true, "ttl": "5m"}}},
      {"type": "item_reference", "id": "doc"},
      {"role": "user", "content": [{"type": "text", "text": "Q?"}]}
    ],
    "choreo": {"output_id": "a1", "workflow_id": "w", "agent_id": "critic", "step_id": 3,
               "next": {"critic": 2, "writer": 1}, "retention": {"priority": -5, "ttl": 90}}
  })");
  const serve::ApiRequest r = serve::parse_request(ApiKind::ChatCompletions, body);
  REQUIRE(r.choreo);
  const serve::ChoreoRequest& c = *r.choreo;
  REQUIRE(c.items.size() == 3);
  CHECK((!c.items[0].reference && c.items[0].id == "sys" && c.items[0].role == "system" &&
         c.items[0].text == "Be brief."));
  REQUIRE(c.items[0].retention);
  CHECK((c.items[0].retention->pin && c.items[0].retention->ttl == std::chrono::minutes(5)));
  CHECK((c.items[1].reference && c.items[1].id == "doc" && c.items[1].param == "messages[1]"));
  CHECK((!c.items[2].reference && c.items[2].id.empty() && c.items[2].text == "Q?"));
  CHECK(c.output_id == "a1");
  CHECK((c.workflow_id == "w" && c.agent_id == "critic" && c.step_id == 3u));
  CHECK(c.next == std::vector<std::pair<std::string, uint64_t>>{{"critic", 2}, {"writer", 1}});
  CHECK((c.retention->priority == -5 && c.retention->ttl == std::chrono::seconds(90) && !c.retention->pin));
  CHECK(r.agent == "critic");  // the log names the agent

  // Responses: item_reference is one of its input item types; Anthropic: the system prompt is the first item.
  const serve::ApiRequest rr = serve::parse_request(
      ApiKind::Responses, json::parse(R"({"input": [{"type": "item_reference", "id": "a1"},
                                                     {"role": "user", "content": "More."}]})"));
  REQUIRE(rr.choreo);
  CHECK((rr.choreo->items.size() == 2 && rr.choreo->items[0].reference));
  const serve::ApiRequest m =
      serve::parse_request(ApiKind::Messages, json::parse(R"({"model": "x", "max_tokens": 4, "system": "S",
                                         "messages": [{"type": "item_reference", "id": "a1"}]})"));
  REQUIRE(m.choreo);
  CHECK((m.choreo->items.size() == 2 && m.choreo->items[0].role == "system" && m.choreo->items[1].reference));

  // Without any extension a request stays plain.
  CHECK_FALSE(serve::parse_request(ApiKind::ChatCompletions,
                                   json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"))
                  .choreo);
}

TEST_CASE("serve extensions: a wrong field of a choreo object is a 400 that names it") {
  struct Case {
    const char* body;
    const char* param;
    const char* code;
  };
  const Case cases[] = {
      {R"({"messages": [{"role": "user", "content": "x", "choreo": {"idd": "y"}}]})",
       "messages[0].choreo.idd", "unknown_parameter"},
      {R"({"messages": [{"role": "user", "content": "x", "choreo": {"id": ""}}]})", "messages[0].choreo.id",
       "invalid_value"},
      {R"({"messages": [{"type": "item_reference"}]})", "messages[0].id", "missing_required_parameter"},
      {R"({"messages": [{"type": "item_reference", "id": "a", "text": "t"}]})", "messages[0].text",
       "unknown_parameter"},
      {R"({"messages": [{"role": "user", "content": "x"}], "choreo": {"retention": {"ttl": "5 minutes"}}})",
       "choreo.retention.ttl", "invalid_value"},
      {R"({"messages": [{"role": "user", "content": "x"}], "choreo": {"retention": {"ttl": 0}}})",
       "choreo.retention.ttl", "invalid_value"},
      {R"({"messages": [{"role": "user", "content": "x"}], "choreo": {"retention": {"pin": "yes"}}})",
       "choreo.retention.pin", "invalid_type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "choreo": {"next": {"a": 1}}})",
       "choreo.workflow_id", "missing_required_parameter"},
      {R"({"messages": [{"role": "user", "content": "x"}], "choreo": {"workflow_id": "w", "next": {"a": -1}}})",
       "choreo.next.a", "invalid_value"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "choreo": {}})", "n",
       "unsupported_parameter"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.body);
    const ApiError e = error_of(ApiKind::ChatCompletions, json::parse(c.body));
    CHECK(e.status == 400);
    CHECK(e.param == c.param);
    CHECK(e.code == c.code);
  }
  const ApiError hint = error_of(ApiKind::ChatCompletions, json::parse(cases[0].body));
  CHECK(std::string(hint.what()).find("did you mean 'id'") != std::string::npos);
  const ApiError completions =
      error_of(ApiKind::Completions, json::parse(R"({"prompt": "x", "choreo": {"output_id": "a"}})"));
  CHECK(completions.code == "unsupported_extension");
}

TEST_CASE("serve hints: pins are leases within a byte budget and a renewed pin keeps its place") {
  serve::ServeHints hints({.max_bytes = 100, .max_lease = std::chrono::seconds(600)});
  serve::RetentionHint pin;
  pin.pin = true;
  CHECK(hints.retain(1, pin, 60));
  CHECK(hints.retention(1)->pin);
  CHECK_FALSE(hints.retain(2, pin, 60));  // 120 > 100
  CHECK_FALSE(hints.retention(2)->pin);
  CHECK(hints.retain(1, pin, 60));  // renewed: not counted twice
  CHECK(hints.pinned_bytes() == 60);
  CHECK(hints.retain(3, pin, 40));
  CHECK(hints.pinned_bytes() == 100);
  CHECK((hints.stats().pins_granted == 2 && hints.stats().pins_refused == 1));
  // A hint without a pin releases one.
  serve::RetentionHint low;
  low.priority = -3;
  CHECK(hints.retain(1, low, 60));
  CHECK((!hints.retention(1)->pin && hints.retention(1)->priority == -3));
  CHECK(hints.pinned_bytes() == 40);
  CHECK_FALSE(hints.retention(99));
}

TEST_CASE("serve hints: a pin's lease runs out unless a hit starts it again") {
  serve::ServeHints hints({.max_bytes = 1000, .max_lease = std::chrono::seconds(600)});
  serve::RetentionHint pin;
  pin.pin = true;
  pin.ttl = std::chrono::milliseconds(30);
  CHECK(hints.retain(1, pin, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  CHECK_FALSE(hints.retention(1)->pin);
  CHECK(hints.pinned_bytes() == 0);
  CHECK(hints.retention(1)->ttl_ms == doctest::Approx(30));

  pin.ttl = std::chrono::milliseconds(1000);
  CHECK(hints.retain(2, pin, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  hints.hit(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  CHECK(hints.retention(2)->pin);  // 1.2 s after the pin, 0.6 s after the hit
}

TEST_CASE(
    "serve hints: a message's steps to execution are the least its reading agents have in the latest next") {
  serve::ServeHints hints({});
  serve::ChoreoRequest a;
  a.workflow_id = "w";
  a.agent_id = "a";
  a.step_id = 1;
  a.next = {{"a", 2}, {"b", 1}};
  const std::vector<kv::MessageId> read_by_a{10, 11};
  hints.step(a, read_by_a);
  serve::ChoreoRequest b = a;
  b.agent_id = "b";
  b.next = {};
  b.step_id.reset();  // no step: `next` stays as it was
  const std::vector<kv::MessageId> read_by_b{11, 12};
  hints.step(b, read_by_b);
  CHECK(hints.steps_to_execution(10) == 2u);
  CHECK(hints.steps_to_execution(11) == 1u);
  CHECK(hints.steps_to_execution(12) == 1u);
  CHECK_FALSE(hints.steps_to_execution(13));

  serve::ChoreoRequest stale = a;  // an older step does not overwrite a newer one's view
  stale.step_id = 0;
  stale.next = {{"a", 7}};
  hints.step(stale, {});
  CHECK(hints.steps_to_execution(10) == 2u);

  serve::ChoreoRequest later = a;
  later.step_id = 2;
  later.next = {{"a", 0}};  // b is not due again
  hints.step(later, {});
  CHECK(hints.steps_to_execution(10) == 0u);
  CHECK(hints.steps_to_execution(11) == 0u);
  CHECK_FALSE(hints.steps_to_execution(12));

  serve::ChoreoRequest other = a;  // another workflow's agents do not read w's messages
  other.workflow_id = "v";
  other.step_id = 5;
  other.next = {{"a", 9}};
  hints.step(other, {});
  CHECK(hints.steps_to_execution(10) == 0u);
}

}  // namespace
}  // namespace choreo
