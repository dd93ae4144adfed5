#include "runtime/exec/scheduler.h"

#include <algorithm>
#include <atomic>
#include <new>
#include <thread>

#include "common/error.h"
#include "runtime/exec/thread_room.h"

namespace choreo::exec {

/// One batch of calls an instance is blocked on.
struct BatchScheduler::Submission {
  bool is_decode = false;
  std::vector<runtime::PrefillRequest> prefills;
  std::vector<runtime::DecodeRequest> decodes;
  std::vector<runtime::PrefillResult> prefill_results;
  std::vector<runtime::DecodeResult> decode_results;
  std::exception_ptr error;
  bool done = false;
};

/// The sink a worker's interpreter sees: each call blocks until the scheduler has run it.
class BatchScheduler::WorkerSink final : public CallSink {
 public:
  explicit WorkerSink(BatchScheduler& scheduler) : scheduler_(scheduler) {}

  std::vector<runtime::PrefillResult> prefill_batch(std::vector<runtime::PrefillRequest> requests) override {
    Submission s;
    s.prefills = std::move(requests);
    wait(s);
    return std::move(s.prefill_results);
  }
  std::vector<runtime::DecodeResult> decode_batch(std::vector<runtime::DecodeRequest> requests) override {
    for (runtime::DecodeRequest& r : requests) r.prefix_scope = scope_;
    Submission s;
    s.is_decode = true;
    s.decodes = std::move(requests);
    wait(s);
    return std::move(s.decode_results);
  }
  const model::Model& model() const override { return scheduler_.engine_.model(); }
  const runtime::ModelSet& models() const override { return scheduler_.engine_.models(); }
  runtime::StepOracleRegistry& step_oracles() override { return scheduler_.engine_.step_oracles(); }
  /// Each instance gets its own prefix scope: in prefix mode it reuses only its own earlier sequences, so its
  /// result does not depend on which instances ran before it or beside it.
  void start_instance(uint64_t scope) { scope_ = scope; }

 private:
  void wait(Submission& s) {
    std::unique_lock lock(scheduler_.mutex_);
    scheduler_.pending_.push_back(&s);
    --scheduler_.running_;
    scheduler_.wake_scheduler_.notify_one();
    scheduler_.wake_workers_.wait(lock, [&] { return s.done; });
    lock.unlock();
    if (s.error) std::rethrow_exception(s.error);
  }

  BatchScheduler& scheduler_;
  uint64_t scope_ = 0;
};

namespace {

/// Runs the requests of several submissions as one engine batch (`call`); if that fails, runs each
/// submission on its own so an error reaches the instance that caused it, and only that one.
template <typename Submission, typename Request, typename Result, typename Call>
void run_merged(const std::vector<Submission*>& subs, std::vector<Request> Submission::*requests,
                std::vector<Result> Submission::*results, const Call& call) {
  if (subs.empty()) return;
  std::vector<Request> merged;
  for (Submission* s : subs) merged.insert(merged.end(), (s->*requests).begin(), (s->*requests).end());
  try {
    std::vector<Result> all = call(merged);
    size_t at = 0;
    for (Submission* s : subs) {
      const size_t n = (s->*requests).size();
      (s->*results).assign(std::make_move_iterator(all.begin() + at), std::make_move_iterator(all.begin() + at + n));
      at += n;
    }
  } catch (...) {
    if (subs.size() == 1) {
      subs[0]->error = std::current_exception();
      return;
    }
    for (Submission* s : subs) {
      try {
        s->*results = call(s->*requests);
      } catch (...) {
        s->error = std::current_exception();
      }
    }
  }
}

/// An instance's allocation failure as the environment's failure, not the row's (exit 1), saying what to
/// change. Never throws: when even the message cannot be made, the std::bad_alloc itself is kept.
std::exception_ptr out_of_memory(size_t instance, size_t n_jobs, int n_workers) noexcept {
  try {
    return std::make_exception_ptr(OutOfMemory(
        fmt::format("out of memory while running instance {} of {} ({} at once): lower --concurrency, "
                    "or raise the memory limit (ulimit -v)",
                    instance + 1, n_jobs, n_workers)));
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

void BatchScheduler::execute(std::vector<Submission*>& ready) {
  std::vector<Submission*> prefills, decodes;
  for (Submission* s : ready) (s->is_decode ? decodes : prefills).push_back(s);
  run_merged(prefills, &Submission::prefills, &Submission::prefill_results,
             [&](std::vector<runtime::PrefillRequest>& requests) {
               if (guard_) guard_->apply(requests);
               ++n_batches_;
               n_requests_ += int(requests.size());
               return engine_.prefill_batch(requests);
             });
  run_merged(decodes, &Submission::decodes, &Submission::decode_results,
             [&](std::vector<runtime::DecodeRequest>& requests) {
               if (guard_) guard_->apply(requests);
               ++n_batches_;
               n_requests_ += int(requests.size());
               return engine_.decode_batch(requests);
             });
}

std::vector<std::exception_ptr> BatchScheduler::run(size_t n_jobs, int concurrency,
                                                    const std::function<void(size_t, CallSink&)>& job) {
  std::vector<std::exception_ptr> errors(n_jobs);
  if (n_jobs == 0) return errors;
  // Never more workers than jobs, and never more than the process limits leave room for, in threads (the
  // compute kernels' threads keep theirs) and in address space; at least one, which this thread could always
  // have run itself.
  const int room = std::max(std::min(thread_room(engine_.model().backend().threads()), memory_room()), 1);
  const int n_workers = int(std::min(size_t(std::clamp(concurrency, 1, room)), n_jobs));
  std::atomic<size_t> next{0};
  const uint64_t first_scope = engine_.new_prefix_scopes(n_jobs);
  auto work = [&] {
    WorkerSink sink(*this);
    for (size_t i = next++; i < n_jobs; i = next++) {
      try {
        sink.start_instance(first_scope + i);
        job(i, sink);
      } catch (const std::bad_alloc&) {
        errors[i] = out_of_memory(i, n_jobs, n_workers);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
    std::lock_guard lock(mutex_);
    --running_;
    wake_scheduler_.notify_one();
  };
  // Workers wait for `go` until all of them exist: when one cannot be started, none has run a job yet, and
  // the ones started are told to stop and are joined before the error leaves.
  bool go = false, stop = false;
  std::vector<std::thread> workers;
  auto stop_workers = [&] {
    {
      std::lock_guard lock(mutex_);
      stop = true;
    }
    wake_workers_.notify_all();
    for (std::thread& t : workers) t.join();
  };
  try {
    workers.reserve(size_t(n_workers));
    for (int w = 0; w < n_workers; ++w) {
      try {
        workers.emplace_back([&] {
          {
            std::unique_lock lock(mutex_);
            wake_workers_.wait(lock, [&] { return go || stop; });
            if (stop) return;
          }
          work();
        });
      } catch (const std::system_error& e) {
        throw RuntimeFailure(fmt::format(
            "cannot start worker thread {} of {} ({}): lower --concurrency, or raise the limit that ran out "
            "(ulimit -u: processes, ulimit -v: memory; each worker needs a stack of ulimit -s)",
            w + 1, n_workers, e.code().message()));
      } catch (const std::bad_alloc&) {
        throw OutOfMemory(fmt::format(
            "cannot start worker thread {} of {} (out of memory): lower --concurrency, or raise the memory "
            "limit (ulimit -v; each worker needs a stack of ulimit -s)",
            w + 1, n_workers));
      }
    }
  } catch (...) {
    stop_workers();
    throw;
  }
  {
    std::lock_guard lock(mutex_);
    running_ = n_workers;
    go = true;
  }
  wake_workers_.notify_all();
  for (;;) {
    std::unique_lock lock(mutex_);
    wake_scheduler_.wait(lock, [&] { return running_ == 0; });
    if (pending_.empty()) break;  // nobody running and nobody waiting: every worker has finished
    std::vector<Submission*> ready = std::move(pending_);
    pending_.clear();
    lock.unlock();
    // Status-aware scheduling: calls whose parents are still being prefetched wait for a later batch while
    // the others run, unless none can run. Results do not depend on the batching (batch invariance).
    std::vector<Submission*> later;
    auto loading = [&](const Submission* s) {
      if (s->is_decode)
        return std::any_of(s->decodes.begin(), s->decodes.end(), [&](const auto& r) { return engine_.loading(r); });
      return std::any_of(s->prefills.begin(), s->prefills.end(), [&](const auto& r) { return engine_.loading(r); });
    };
    auto waits = std::stable_partition(ready.begin(), ready.end(), [&](const Submission* s) { return !loading(s); });
    if (waits != ready.begin()) {
      later.assign(waits, ready.end());
      ready.erase(waits, ready.end());
      n_deferred_ += int(later.size());
    }
    execute(ready);
    lock.lock();
    for (Submission* s : ready) {
      s->done = true;
      ++running_;
    }
    pending_.insert(pending_.end(), later.begin(), later.end());
    wake_workers_.notify_all();
  }
  for (std::thread& t : workers) t.join();
  return errors;
}

}  // namespace choreo::exec
