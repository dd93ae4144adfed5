#pragma once
// `choreo serve`'s routes: the OpenAI and Anthropic endpoints over one long-lived engine (docs/serve.md).
// Each request is authenticated (when the server has a key), admitted (at most max_concurrency in flight, else
// 429), parsed (runtime/serve/api.h), run as a plain generation on the engine thread
// (runtime/serve/engine_service.h), answered whole or streamed, counted, and logged in one line.

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/serve/api.h"
#include "runtime/serve/bounded_map.h"
#include "runtime/serve/engine_service.h"
#include "runtime/serve/http_server.h"
#include "runtime/serve/metrics.h"

namespace choreo::serve {

/// What the server is told at start-up.
struct ServeOptions {
  std::string api_key;            // empty: no key asked
  int max_concurrency = 64;       // generations in flight; more are answered 429
  bool metrics = false;           // GET /metrics
  bool log_requests = true;       // one line per request on `log`
  size_t max_stored_responses = size_t(1) << 14;
  ExtensionOptions extensions;    // pins' budget and lease, names kept
  std::FILE* log = stderr;
};

class Server {
 public:
  /// `model_ids[i]` is the id of the engine's model i, as /v1/models lists it.
  Server(std::unique_ptr<runtime::OpenedEngine> engine, std::vector<std::string> model_ids, ServeOptions options);
  /// Answers one HTTP request (called by the HTTP server's connection threads, concurrently).
  void handle(const HttpRequest& request, HttpResponder& responder);
  const std::vector<std::string>& model_ids() const { return model_ids_; }
  EngineService& service() { return service_; }

 private:
  /// A conversation stored for /v1/responses' previous_response_id.
  struct Stored {
    std::vector<model::ChatMessage> messages;  // without the request's instructions, with its answer
    int model = 0;
  };
  void generation(ApiKind kind, const std::string& endpoint, const HttpRequest& request, HttpResponder& responder);
  void run_generation(ApiRequest& api, int model, HttpResponder& responder, const std::string& endpoint);
  static GenerationSettings settings(const ApiRequest& api, int model);
  std::shared_ptr<Generation> start_plain(ApiRequest& api, int model);
  std::shared_ptr<Generation> start_extension(ApiRequest& api, int model);
  std::vector<model::Token> prompt_tokens(ApiRequest& api, int model);
  int resolve_model(const std::string& id) const;
  bool authorized(const HttpRequest& request) const;
  std::string new_id(const char* prefix);
  std::string gauges();
  static std::string extension_gauges(const EngineService::Snapshot& s);
  void log_line(const std::string& id, const ApiRequest& api, const GenerationResult& result, int status);

  ServeOptions options_;
  std::vector<std::string> model_ids_;
  EngineService service_;
  Metrics metrics_;
  std::atomic<int> in_flight_{0};
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;
  std::mutex stored_mutex_;
  BoundedMap<Stored> stored_;
};

}  // namespace choreo::serve
