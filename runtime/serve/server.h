#pragma once
// `choreo serve`'s routes: the OpenAI and Anthropic endpoints over one long-lived engine (docs/serve.md).
// Each request is authenticated (when the server has a key), admitted (at most max_concurrency in flight, else
// 429), parsed (runtime/serve/api.h), run as a plain generation on the engine thread
// (runtime/serve/engine_service.h), answered whole or streamed, counted, and logged in one line.

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/serve/api.h"
#include "runtime/serve/bounded_map.h"
#include "runtime/serve/engine_service.h"
#include "runtime/serve/http_server.h"
#include "runtime/serve/metrics.h"

namespace choreo::serve {

/// The workflows the server runs (`--workflows DIR`, POST /choreo/v1/workflows/{name}); the CLI makes it.
struct WorkflowRunner {
  std::vector<std::string> names;  // GET /choreo/v1/workflows lists them
  /// Runs workflow `name` on `engine` (on the engine thread) with the inputs and params of the request `body`:
  /// calls `started` once the run's plan is compiled (its inputs are good), `emit` with the text `choreo run`
  /// prints as it comes, and returns run's --json record. ApiError for an unknown name (404) or bad inputs (400)
  /// and for a run that fails; exec::RunCancelled once `cancelled` (asked between batches and tokens) says so.
  std::function<nlohmann::ordered_json(const std::string& name, const nlohmann::json& body, runtime::Engine& engine,
                                       const std::function<void()>& started,
                                       const std::function<void(std::string)>& emit,
                                       const std::function<bool()>& cancelled)>
      run;
};

/// What the server is told at start-up.
struct ServeOptions {
  std::string api_key;            // empty: no key asked
  int max_concurrency = 64;       // generations in flight; more are answered 429
  bool metrics = false;           // GET /metrics
  bool log_requests = true;       // one line per request on `log`
  size_t max_stored_responses = size_t(1) << 14;
  size_t max_stored_bytes = size_t(256) << 20;  // the text of stored responses, in all (the oldest go first)
  ExtensionOptions extensions;    // pins' budget and lease, names kept
  WorkflowRunner workflows;       // none: the workflow endpoint answers 404
  std::chrono::seconds workflow_timeout{600};  // a workflow run is cancelled past it (503 workflow_timeout)
  std::FILE* log = stderr;
};

/// A log line's text with control characters, bidirectional controls and bytes that are not UTF-8 shown as '?'.
std::string printable(const std::string& s);

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
  /// A generation (or workflow run) counted in flight while it lives.
  class InFlight {
   public:
    explicit InFlight(std::atomic<int>& n) : n_(&n), admitted_(++n) {}
    InFlight(InFlight&& other) noexcept : n_(std::exchange(other.n_, nullptr)), admitted_(other.admitted_) {}
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    InFlight& operator=(InFlight&&) = delete;
    ~InFlight() {
      if (n_) --*n_;
    }
    /// How many were in flight with this one when it was counted.
    int admitted() const { return admitted_; }

   private:
    std::atomic<int>* n_;
    int admitted_;
  };
  /// Checks the API key and counts the request in flight; ApiError 401, or 429 past --max-concurrency.
  InFlight admit(const HttpRequest& request, ApiKind kind);
  void generation(ApiKind kind, const std::string& endpoint, const HttpRequest& request, HttpResponder& responder);
  /// POST /choreo/v1/workflows/{name}; returns the status answered.
  int workflow(const std::string& name, const HttpRequest& request, HttpResponder& responder);
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
  void log_workflow(const std::string& name, int status);

  ServeOptions options_;
  std::vector<std::string> model_ids_;
  EngineService service_;
  Metrics metrics_;
  std::atomic<int> in_flight_{0};
  std::mutex stored_mutex_;
  BoundedMap<Stored> stored_;
};

}  // namespace choreo::serve
