#pragma once
// One long-lived engine shared by many request threads (`choreo serve`). The engine, its page pool and the plain
// decoder are only ever touched by the service's own thread. A request thread queues work there: a job (a
// function given the engine, run alone: reading its state for /metrics) or a plain generation
// (runtime/serve/plain_decoder.h). The thread admits the generations that arrived, then runs one decode step of
// every choice in flight (continuous batching), and again, running jobs in between.

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine/open_engine.h"
#include "runtime/serve/plain_decoder.h"

namespace choreo::serve {

class EngineService {
 public:
  /// Starts the engine thread.
  explicit EngineService(std::unique_ptr<runtime::OpenedEngine> opened);
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
  /// Starts a plain generation on the engine thread and returns at once; `g` tells its progress.
  void start(std::shared_ptr<PlainGeneration> g);

  /// What the plain decoder, its session cache and the page pool show now (read on the engine thread).
  struct Snapshot {
    PlainStats plain;
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
  PlainDecoder plain_;  // the engine thread's
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(runtime::Engine&)>> jobs_;
  std::vector<std::shared_ptr<PlainGeneration>> arrived_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything else exists
};

}  // namespace choreo::serve
