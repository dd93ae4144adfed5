#include "kernels/cpu/thread_pool.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include <immintrin.h>

namespace choreo::kernels::cpu {

namespace {

/// How long an idle thread spins before it sleeps. Kernels of one forward pass follow each other within
/// microseconds, so a worker that spins this long rarely sleeps during a pass; one that sleeps costs a futex
/// wake (several microseconds) on the next loop.
constexpr auto kSpin = std::chrono::microseconds(60);

/// Spins until `ready()` or kSpin has passed; true if ready.
template <class Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return true;
      _mm_pause();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

struct ThreadPool::State {
  // The current loop. Its caller writes these only while epoch is odd and no worker is inside (active ==
  // 0); a worker reads them only while it is counted in active and epoch is still the even value it saw.
  Call call = nullptr;
  void* context = nullptr;
  int64_t n_items = 0;
  int64_t grain = 1;
  int team = 1;  // workers 1 .. team-1 take part
  std::exception_ptr error;  // the first failure, written by the thread that set `failed`

  /// Thread t's share of the loop's pieces, [begin, end) packed as (end << 32 | begin). Each thread takes
  /// pieces from the front of its own share, in order (so that its prefetches run ahead of it, and its
  /// claims touch a cache line no other thread writes); one that has run out takes pieces from the back of
  /// the fullest other share. Both change a share with one compare-and-swap, so a piece runs exactly once.
  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};
  };
  std::vector<Share> shares;

  alignas(64) std::atomic<uint32_t> epoch{0};  // even: a loop is published; odd: its caller is writing one
  alignas(64) std::atomic<int64_t> done{0};    // items finished (or skipped after a failure)
  alignas(64) std::atomic<int> active{0};      // workers inside the current loop
  std::atomic<int> sleeping{0};                // workers asleep on epoch
  alignas(64) std::atomic<uint32_t> finished{0};  // bumped when done reaches n_items while the caller sleeps
  std::atomic<bool> caller_sleeping{false};
  std::atomic<bool> failed{false};
  std::atomic<bool> stopping{false};

  std::mutex run_mutex;  // one loop at a time
  std::vector<std::thread> workers;

  static uint64_t pack(uint64_t begin, uint64_t end) { return end << 32 | begin; }

  /// A piece for `thread`: the next of its own share, else the last of the share with most left; -1 when
  /// every piece has been claimed.
  int64_t claim(int thread) {
    std::atomic<uint64_t>& own = shares[thread].range;
    for (uint64_t r = own.load(std::memory_order_relaxed); uint32_t(r) < uint32_t(r >> 32);) {
      if (own.compare_exchange_weak(r, r + 1)) return int64_t(uint32_t(r));
    }
    for (;;) {
      int victim = -1;
      uint32_t most = 0;
      for (int t = 0; t < team; ++t) {
        const uint64_t r = shares[t].range.load(std::memory_order_relaxed);
        const uint32_t left = uint32_t(r >> 32) - std::min(uint32_t(r), uint32_t(r >> 32));
        if (left > most) most = left, victim = t;
      }
      if (victim < 0) return -1;
      std::atomic<uint64_t>& other = shares[victim].range;
      uint64_t r = other.load();
      const uint32_t begin = uint32_t(r), end = uint32_t(r >> 32);
      if (begin < end && other.compare_exchange_strong(r, pack(begin, end - 1))) return int64_t(end) - 1;
    }
  }

  /// Claims and runs pieces of the current loop until none is left.
  void work(int thread) {
    for (int64_t piece; (piece = claim(thread)) >= 0;) {
      const int64_t begin = piece * grain, end = std::min(n_items, begin + grain);
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          call(context, begin, end);
        } catch (...) {
          if (!failed.exchange(true)) error = std::current_exception();
        }
      }
      if (done.fetch_add(end - begin) + (end - begin) == n_items && caller_sleeping.load()) {
        finished.fetch_add(1);
        finished.notify_one();
      }
    }
  }

  void worker_main(int index) {
    uint32_t seen = 0;
    for (;;) {
      uint32_t e = 0;
      const auto published = [&] {
        e = epoch.load(std::memory_order_acquire);
        return stopping.load(std::memory_order_relaxed) || (e != seen && e % 2 == 0);
      };
      while (!spin_until(published)) {
        sleeping.fetch_add(1);
        e = epoch.load();
        if (!stopping.load() && (e == seen || e % 2 == 1)) epoch.wait(e);
        sleeping.fetch_sub(1);
      }
      if (stopping.load()) return;
      seen = e;
      active.fetch_add(1);
      // The loop of epoch e is still the current one, and stays so while this worker is counted in active.
      if (epoch.load() == e && index < team) work(index);
      active.fetch_sub(1, std::memory_order_release);
    }
  }

  void stop() {
    stopping.store(true);
    epoch.fetch_add(2);
    epoch.notify_all();
    for (std::thread& t : workers) t.join();
  }
};

ThreadPool::~ThreadPool() {
  if (state_ == nullptr) return;
  if (pid_ == ::getpid()) {
    state_->stop();
    delete state_;
  }  // else: inherited through fork, its threads do not exist here; abandoned
}

void ThreadPool::set_threads(int n_threads) { n_threads_.store(std::max(1, n_threads)); }

ThreadPool::State& ThreadPool::state() {
  std::lock_guard lock(state_mutex_);
  if (state_ == nullptr || pid_ != ::getpid()) {
    state_ = new State;  // a forked copy's old state is abandoned (see the header)
    pid_ = ::getpid();
  }
  return *state_;
}

void ThreadPool::run(int64_t n_items, int64_t grain, Call call, void* context) {
  if (n_items <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_items / grain >= (int64_t(1) << 31)) grain = n_items / ((int64_t(1) << 31) - 1) + 1;  // shares pack 32 bits
  const int64_t n_pieces = (n_items + grain - 1) / grain;
  const int team = static_cast<int>(std::min<int64_t>(threads(), n_pieces));
  const auto serially = [&] {
    for (int64_t begin = 0; begin < n_items; begin += grain) call(context, begin, std::min(n_items, begin + grain));
  };
  if (team <= 1) return serially();
  State& s = state();
  std::unique_lock lock(s.run_mutex, std::try_to_lock);
  if (!lock.owns_lock()) return serially();  // another thread's loop holds the pool

  while (int(s.workers.size()) < team - 1) {
    const int index = int(s.workers.size()) + 1;
    s.workers.emplace_back([&s, index] { s.worker_main(index); });
  }
  s.epoch.fetch_add(1);  // odd: workers that wake now leave the fields alone
  while (s.active.load() != 0) {
    if (!spin_until([&] { return s.active.load() == 0; })) std::this_thread::yield();
  }
  s.call = call;
  s.context = context;
  s.n_items = n_items;
  s.grain = grain;
  s.team = team;
  s.error = nullptr;
  s.failed.store(false, std::memory_order_relaxed);
  if (int(s.shares.size()) < team) s.shares = std::vector<State::Share>(size_t(team));
  for (int t = 0; t < team; ++t) {
    s.shares[t].range.store(State::pack(uint64_t(n_pieces * t / team), uint64_t(n_pieces * (t + 1) / team)),
                            std::memory_order_relaxed);
  }
  s.done.store(0, std::memory_order_relaxed);
  s.epoch.fetch_add(1);  // even: published
  if (s.sleeping.load() > 0) s.epoch.notify_all();

  s.work(0);
  if (!spin_until([&] { return s.done.load() == n_items; })) {
    s.caller_sleeping.store(true);
    for (;;) {
      const uint32_t f = s.finished.load();
      if (s.done.load() == n_items) break;
      s.finished.wait(f);
    }
    s.caller_sleeping.store(false);
  }
  if (s.failed.load()) std::rethrow_exception(s.error);
}

ThreadPool& kernel_pool() {
  static ThreadPool* pool = new ThreadPool;  // never destroyed: kernels may run during static destruction
  return *pool;
}

}  // namespace choreo::kernels::cpu
