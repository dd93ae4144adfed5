#pragma once
// The CPU kernels' threads: a persistent pool, started once, that runs one parallel loop at a time.
//
// Work is shared dynamically. The items of a loop are cut into pieces, and every thread starts on its own
// contiguous share of them; a thread that has finished its share takes pieces from the back of the others'.
// A loop ends when all of its items are done, not when every thread has checked in. A thread that another
// process holds off its core therefore delays only the piece it is running: the others take the rest of its
// share, and nobody waits for a thread that never got to run.
//
// Idle workers spin for a short while (the gap between two kernels of a forward pass is a few microseconds),
// then sleep on a futex, so a pool that has nothing to do costs no CPU. Results never depend on which thread
// ran an item; the kernels keep every item's arithmetic independent of the schedule (batch invariance).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <type_traits>

namespace choreo::kernels::cpu {

class ThreadPool {
 public:
  ThreadPool() = default;
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Threads a loop may use, the calling thread included (>= 1). Workers are started when first needed.
  void set_threads(int n_threads);
  int threads() const { return n_threads_.load(std::memory_order_relaxed); }

  /// Calls body(begin, end) for pieces [begin, end) of [0, n_items), each of at most `grain` items, on up to
  /// threads() threads; returns when all are done. The first exception a piece throws is rethrown here
  /// (after every claimed piece has finished); pieces not yet claimed then do not run. A loop started while
  /// another thread's loop runs on the pool runs on the calling thread alone.
  template <class Body>
  void parallel_for(int64_t n_items, int64_t grain, Body&& body) {
    using B = std::remove_reference_t<Body>;
    run(n_items, grain,
        [](void* context, int64_t begin, int64_t end) { (*static_cast<B*>(context))(begin, end); },
        const_cast<void*>(static_cast<const void*>(&body)));
  }

  /// Pieces for `n_items` items such that every thread gets about `pieces_per_thread` of them: small enough
  /// to balance when a thread falls behind, large enough that claiming costs little.
  int64_t grain_for(int64_t n_items, int pieces_per_thread = 4) const {
    const int64_t pieces = int64_t(threads()) * pieces_per_thread;
    return std::max<int64_t>(1, (n_items + pieces - 1) / pieces);
  }

 private:
  using Call = void (*)(void*, int64_t, int64_t);
  struct State;
  void run(int64_t n_items, int64_t grain, Call call, void* context);
  /// This process's workers and loop state, made on first use. A process forked from one with workers
  /// has none of their threads: it abandons the inherited state (possibly locked at the fork) and starts
  /// its own.
  State& state();

  std::atomic<int> n_threads_{1};
  std::mutex state_mutex_;
  State* state_ = nullptr;
  int pid_ = 0;  // the process that made state_
};

/// The pool every CPU kernel uses (one per process; the CPU backend sizes it).
ThreadPool& kernel_pool();

}  // namespace choreo::kernels::cpu
