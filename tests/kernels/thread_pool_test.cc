// The CPU kernels' thread pool: every item runs exactly once, failures reach the caller, a thread held up
// in one piece leaves the rest of its share to the others, and a forked child still completes its loops.

#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace choreo::kernels::cpu {
namespace {

/// Restores the pool's thread count when a test ends.
struct SavedThreads {
  int saved = kernel_pool().threads();
  ~SavedThreads() { kernel_pool().set_threads(saved); }
};

TEST_CASE("thread pool: every item runs exactly once, in pieces of at most the grain") {
  SavedThreads restore;
  ThreadPool& pool = kernel_pool();
  for (int threads : {1, 2, 3, 5}) {
    pool.set_threads(threads);
    for (int64_t n : {1, 2, 7, 64, 1000, 4099}) {
      for (int64_t grain : {int64_t(1), int64_t(3), int64_t(64), n}) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
        std::atomic<bool> oversized{false};
        pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
          if (end - begin > grain || begin < 0 || end > n || begin >= end) oversized = true;
          for (int64_t i = begin; i < end; ++i) runs[size_t(i)].fetch_add(1);
        });
        CHECK_FALSE(oversized.load());
        int wrong = 0;
        for (auto& r : runs) wrong += r.load() != 1;
        CHECK_MESSAGE(wrong == 0, "threads ", threads, " n ", n, " grain ", grain);
      }
    }
  }
}

TEST_CASE("thread pool: loops back to back see each other's writes") {
  SavedThreads restore;
  ThreadPool& pool = kernel_pool();
  pool.set_threads(2);
  std::vector<int64_t> a(4096), b(4096);
  for (int round = 0; round < 2000; ++round) {
    pool.parallel_for(4096, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) a[size_t(i)] = i + round;
    });
    pool.parallel_for(4096, 64, [&](int64_t begin, int64_t end) {
      // Reads items another thread may have written in the previous loop.
      for (int64_t i = begin; i < end; ++i) b[size_t(i)] = a[size_t(4095 - i)];
    });
    if (b[0] != 4095 + round || b[4095] != round) {
      FAIL("round ", round, ": stale values");
      break;
    }
  }
}

TEST_CASE("thread pool: a failing piece's exception reaches the caller, and the pool still works after") {
  SavedThreads restore;
  ThreadPool& pool = kernel_pool();
  pool.set_threads(2);
  CHECK_THROWS_AS(pool.parallel_for(100, 1,
                                    [&](int64_t begin, int64_t) {
                                      if (begin == 37) throw std::runtime_error("piece 37");
                                    }),
                  std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) sum += i;
  });
  CHECK(sum.load() == 4950);
}

TEST_CASE("thread pool: a thread held up in one piece leaves the rest of its share to the others") {
  SavedThreads restore;
  ThreadPool& pool = kernel_pool();
  pool.set_threads(2);
  // Warm the worker up, so that it takes part in the loop below.
  pool.parallel_for(64, 1, [](int64_t, int64_t) {});
  const std::thread::id caller = std::this_thread::get_id();
  constexpr int64_t kPieces = 40;
  std::vector<std::thread::id> ran_on(kPieces);
  std::atomic<bool> held{false};
  pool.parallel_for(kPieces, 1, [&](int64_t begin, int64_t) {
    ran_on[size_t(begin)] = std::this_thread::get_id();
    // The first piece the worker gets, it is held off for a long time (as by another process on its core).
    if (std::this_thread::get_id() != caller && !held.exchange(true))
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  int64_t on_worker = 0;
  for (const auto& id : ran_on) on_worker += id != caller;
  if (held.load()) {
    // The worker ran the piece it was held in, and maybe a few it claimed before; the caller took the rest of
    // the worker's share (half the pieces) instead of leaving it for after the hold-up.
    CHECK(on_worker >= 1);
    CHECK(on_worker < kPieces / 4);
  } else {
    // The worker never woke up in time: the caller ran everything, and did not wait for it.
    CHECK(on_worker == 0);
  }
}

TEST_CASE("thread pool: loops started from two threads at once both complete") {
  SavedThreads restore;
  ThreadPool& pool = kernel_pool();
  pool.set_threads(2);
  std::atomic<int64_t> total{0};
  auto loops = [&] {
    for (int i = 0; i < 300; ++i) {
      pool.parallel_for(257, 4, [&](int64_t begin, int64_t end) { total += end - begin; });
    }
  };
  std::thread other(loops);
  loops();
  other.join();
  CHECK(total.load() == 2 * 300 * 257);
}

TEST_CASE("thread pool: a process forked after the workers started completes its loops") {
  SavedThreads restore;
  ThreadPool& pool = kernel_pool();
  pool.set_threads(2);
  pool.parallel_for(64, 1, [](int64_t, int64_t) {});  // the parent's worker exists
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::atomic<int64_t> sum{0};
    for (int round = 0; round < 50; ++round) {
      pool.parallel_for(1000, 8, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sum += i;
      });
    }
    _exit(sum.load() == 50 * 499500 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace choreo::kernels::cpu
