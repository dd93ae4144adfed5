// libFuzzer target for `choreo serve`'s request bodies (runtime/serve/api): any bytes, as the body of each
// endpoint, must parse into a generation request within the documented bounds or be refused with an ApiError of
// status 400; the answer shapes built from a parsed request must be valid JSON. Never a crash, hang, leak or
// another exception. With CHOREO_FUZZ_SEED_DIR set, start-up writes seeds there (scripts/fuzz.sh).

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/serve/api.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

void write_seeds() {
  const char* dir = std::getenv("CHOREO_FUZZ_SEED_DIR");
  if (!dir) return;
  const char* seeds[] = {
      R"({"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":8,"temperature":0.5,"top_p":0.9,"seed":3,"stop":["\n"],"n":2,"stream":true,"stream_options":{"include_usage":true}})",
      R"({"prompt":["Once upon"],"max_tokens":4,"stop":"x"})",
      R"({"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"instructions":"x","previous_response_id":"resp_1","store":false,"max_output_tokens":3})",
      R"({"model":"m","max_tokens":5,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"q"}],"stop_sequences":["a"],"cache_control":{"type":"ephemeral"}})",
  };
  int i = 0;
  for (const char* s : seeds) std::ofstream(std::filesystem::path(dir) / ("seed_" + std::to_string(i++))) << s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool seeded = (write_seeds(), true);
  (void)seeded;
  const std::string body =
      choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 256 << 10);
  using choreo::serve::ApiKind;
  for (ApiKind kind : {ApiKind::ChatCompletions, ApiKind::Completions, ApiKind::Responses, ApiKind::Messages}) {
    try {
      const choreo::serve::ApiRequest r = choreo::serve::parse_request(kind, choreo::serve::parse_body(body));
      if (r.n < 1 || r.n > 16 || r.stop.size() > 16 || r.max_tokens < 0) __builtin_trap();
      if (kind != ApiKind::Completions && r.messages.empty()) __builtin_trap();
      choreo::serve::GenerationResult result;
      result.choices.resize(size_t(r.n));
      choreo::serve::Answer answer{"resp_0000", "m", 0, r.previous_response_id};  // stream_start numbers its events in it
      if (nlohmann::json::parse(choreo::serve::answer_body(r, answer, result), nullptr, false).is_discarded())
        __builtin_trap();
      for (const std::string& e : choreo::serve::stream_start(r, answer, result.usage)) (void)e;
    } catch (const choreo::serve::ApiError& e) {
      if (e.status != 400 || std::string(e.what()).empty()) __builtin_trap();
    }
  }
  return 0;
}
