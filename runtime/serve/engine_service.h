#pragma once
// One long-lived engine shared by many request threads (`choreo serve`). The engine, its page pool and the
// decoders are only ever touched by the service's own thread. A request thread queues work there: a job (a
// function given the engine, run alone: reading its state for /metrics), a plain generation
// (runtime/serve/plain_decoder.h) or one with choreo's extensions (runtime/serve/choreo_decoder.h). The thread
// admits the plain generations that arrived, runs the extension generations that arrived as one group (their
// calls batched), then one decode step of every plain choice in flight (continuous batching), and again,
// running jobs in between.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine/open_engine.h"
#include "runtime/serve/choreo_decoder.h"
#include "runtime/serve/plain_decoder.h"

namespace choreo::serve {

/// How the service runs requests with choreo's extensions.
struct ExtensionOptions {
  PinLimits pins;
  size_t max_names = size_t(1) << 16;  // message names kept (the least recently used go)
};

class EngineService {
 public:
  /// Starts the engine thread.
  explicit EngineService(std::unique_ptr<runtime::OpenedEngine> opened, ExtensionOptions extensions = {});
  /// Finishes what is queued and in flight, then stops the engine thread.
  ~EngineService();
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  /// Runs `job` on the engine thread, alone, and returns what it returns (rethrowing what it throws).
  template <typename F>
  auto run(F job) -> decltype(job(std::declval<runtime::Engine&>())) {
    using R = decltype(job(std::declval<runtime::Engine&>()));
    std::packaged_task<R(runtime::Engine&)> task(std::move(job));
    std::future<R> done = task.get_future();
    enqueue_job([&task](runtime::Engine& e) { task(e); });
    return done.get();
  }
  /// Runs `job` on the engine thread, alone, and returns at once (what it throws is its own to report).
  void post(std::function<void(runtime::Engine&)> job) { enqueue_job(std::move(job)); }
  /// Starts a plain generation on the engine thread and returns at once; `g` tells its progress.
  void start(std::shared_ptr<PlainGeneration> g);
  /// Starts a generation with choreo's extensions; it runs with those that arrive within a moment of it.
  void start(std::shared_ptr<ExtensionGeneration> g);

  /// What the plain decoder, its session cache and the page pool show now (read on the engine thread).
  struct Snapshot {
    PlainStats plain;
    ExtensionStats extensions;
    HintStats hints;
    size_t pinned_bytes = 0;
    size_t names = 0;
    kv::TierStats tiers;
    size_t t1_in_use_bytes = 0, t1_budget_bytes = 0;
    SessionCacheStats cache;
    size_t sessions = 0;
    size_t t0_in_use_bytes = 0, t0_budget_bytes = 0;
  };
  Snapshot snapshot();

  /// The engine's models and their weights: fixed once the service starts, so any thread may read them.
  const runtime::ModelSet& models() const { return models_; }

 private:
  void enqueue_job(std::function<void(runtime::Engine&)> job);
  void loop();

  std::unique_ptr<runtime::OpenedEngine> opened_;
  const runtime::ModelSet& models_;
  PlainDecoder plain_;     // the engine thread's
  ChoreoDecoder choreo_;   // the engine thread's
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(runtime::Engine&)>> jobs_;
  std::vector<std::shared_ptr<PlainGeneration>> arrived_;
  std::vector<std::shared_ptr<ExtensionGeneration>> extensions_arrived_;
  std::chrono::steady_clock::time_point first_extension_{};  // when the oldest of them arrived
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything else exists
};

}  // namespace choreo::serve
