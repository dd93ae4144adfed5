#pragma once
// Batching across workflow instances (`choreo run --inputs rows.jsonl --concurrency K`): each instance runs
// its interpreter on a worker thread and hands its engine calls to the scheduler, which waits until every
// running instance is either blocked on a call or finished, then runs all ready prefills as one engine batch
// and all ready decodes as another, and wakes the instances with their results. The engine is only ever
// touched by the thread that calls run(); static messages shared by the instances are deduplicated by the
// engine's content keys, so they are encoded once.
//
// Status-aware scheduling: a call whose parents are still being prefetched into T0 (Engine::loading) waits
// for a later batch while the ready ones run.
//
// Decodes merged into one batch finish together (the engine steps a batch until its longest member is done):
// this is static batching across instances, not continuous batching.

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "runtime/exec/call_sink.h"
#include "runtime/exec/leak_guard.h"

namespace choreo::exec {

/// Runs many interpreters' calls in merged engine batches.
class BatchScheduler {
 public:
  /// `guard` (optional) cleans parents before each batch (`--no-leak`).
  BatchScheduler(runtime::Engine& engine, LeakGuard* guard = nullptr) : engine_(engine), guard_(guard) {}

  /// Runs `n_jobs` jobs on `concurrency` worker threads (fewer when there are fewer jobs or when the process
  /// limits leave less room: thread_room.h); job(i, sink) runs instance i, sending its calls to `sink`. An
  /// exception a job throws is kept and returned at its index (nullptr for success); the other jobs continue.
  /// When a worker thread cannot be started, no job runs: the workers already started are joined and a
  /// RuntimeFailure says which limit to raise.
  std::vector<std::exception_ptr> run(size_t n_jobs, int concurrency,
                                      const std::function<void(size_t, CallSink&)>& job);

  /// Engine batches issued (prefill and decode) and the requests in them, for reports and tests.
  int n_batches() const { return n_batches_; }
  int n_requests() const { return n_requests_; }
  /// Submissions held back for a later batch because a parent was still being prefetched.
  int n_deferred() const { return n_deferred_; }

 private:
  struct Submission;
  class WorkerSink;
  void execute(std::vector<Submission*>& ready);

  runtime::Engine& engine_;
  LeakGuard* guard_;
  std::mutex mutex_;
  std::condition_variable wake_scheduler_, wake_workers_;
  std::vector<Submission*> pending_;
  int running_ = 0;  // workers currently running a job and not blocked on a call
  int n_batches_ = 0;
  int n_requests_ = 0;
  int n_deferred_ = 0;
};

}  // namespace choreo::exec
