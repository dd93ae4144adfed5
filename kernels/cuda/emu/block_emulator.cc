#include "kernels/cuda/emu/block_emulator.h"

#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>
#include <fmt/format.h>

#include <array>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

namespace choreo::cuda::emu {

namespace ctx = boost::context;

namespace {

enum class State { Ready, AtBarrier, AtWarp, Done };

struct Thread {
  Dim3 idx;
  unsigned linear = 0;
  State state = State::Ready;
  ctx::fiber fiber;  // the thread's own context while it is suspended
  ctx::fiber back;   // the scheduler's, while the thread runs
  std::exception_ptr error;
};

struct Warp {
  std::array<uint32_t, kWarpSize> posted{};     // what each lane published for the pending exchange
  std::array<uint32_t, kWarpSize> released{};   // the values of the last completed exchange
  unsigned live = 0;                             // lanes of the warp that exist in the block
};

/// Who touched a shared word since the last barrier.
struct Shadow {
  uint64_t epoch = 0;
  int writer = -1;
  int reader = -1;  // -1: none, -2: several
};

struct Block {
  const LaunchConfig* config = nullptr;
  Dim3 idx;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::unique_ptr<std::max_align_t[]> dynamic;
  struct Region {
    std::unique_ptr<std::max_align_t[]> memory;
    size_t bytes = 0;
  };
  std::map<const void*, Region> statics;  // static __shared__ arrays by declaration site
  std::unordered_map<uintptr_t, Shadow> shadow;
  uint64_t epoch = 1;
  Thread* current = nullptr;
};

thread_local Block* t_block = nullptr;
Counters g_counters;

Block& block() {
  if (!t_block) throw EmulationError("a CUDA device function was called outside an emulated kernel launch");
  return *t_block;
}

Thread& self() { return *block().current; }

std::string describe(Dim3 d) { return fmt::format("({}, {}, {})", d.x, d.y, d.z); }

std::string where(const Block& b, const Thread* t) {
  std::string s = fmt::format("kernel {}, block {}", b.config->kernel, describe(b.idx));
  if (t) s += fmt::format(", thread {}", describe(t->idx));
  return s;
}

/// Back to the scheduler until it resumes this thread.
void yield(State state) {
  Thread& t = self();
  t.state = state;
  ++g_counters.switches;
  t.back = std::move(t.back).resume();
}

size_t alloc_units(size_t bytes) { return (bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t); }

void check_config(const LaunchConfig& c) {
  const auto bad = [&](const std::string& what) {
    throw EmulationError(fmt::format("kernel {}: invalid launch configuration: {} (grid {}, block {})", c.kernel, what,
                                     describe(c.grid), describe(c.block)));
  };
  if (c.grid.count() == 0 || c.block.count() == 0) bad("an empty grid or block");
  if (c.block.count() > 1024) bad("more than 1024 threads per block");
  if (c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64) bad("a block dimension above CUDA's limits");
  if (c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535) bad("a grid dimension above CUDA's limits");
  if (c.dynamic_shared > 227 * 1024) bad("more than 227 KiB of dynamic shared memory");
}

/// Releases the warps whose every live lane waits at an exchange; true when one was.
bool release_warps(Block& b) {
  bool any = false;
  for (size_t w = 0; w < b.warps.size(); ++w) {
    Warp& warp = b.warps[w];
    const size_t first = w * kWarpSize;
    bool all = true;
    for (unsigned lane = 0; lane < warp.live; ++lane) all = all && b.threads[first + lane].state == State::AtWarp;
    if (!all) continue;
    warp.released = warp.posted;
    for (unsigned lane = 0; lane < warp.live; ++lane) b.threads[first + lane].state = State::Ready;
    any = true;
  }
  return any;
}

void run_block(Block& b, ctx::pooled_fixedsize_stack& stacks, const std::function<void()>& body) {
  for (Thread& t : b.threads) {
    t.fiber = ctx::fiber(std::allocator_arg, stacks, [&b, &t, &body](ctx::fiber&& back) {
      t.back = std::move(back);
      try {
        body();
      } catch (const std::exception&) {
        t.error = std::current_exception();
      }
      t.state = State::Done;
      return std::move(t.back);
    });
  }
  const auto stop = [&](std::exception_ptr e) {
    for (Thread& t : b.threads) t.fiber = {};  // unwinds every suspended thread
    std::rethrow_exception(e);
  };
  for (;;) {
    for (Thread& t : b.threads) {
      if (t.state != State::Ready) continue;
      b.current = &t;
      t.fiber = std::move(t.fiber).resume();
      b.current = nullptr;
      if (t.error) stop(t.error);
    }
    size_t done = 0, at_barrier = 0;
    for (const Thread& t : b.threads) {
      done += t.state == State::Done;
      at_barrier += t.state == State::AtBarrier;
    }
    if (done == b.threads.size()) return;
    if (release_warps(b)) continue;
    const auto some = [&](State s) {
      const Thread* found = nullptr;
      for (const Thread& t : b.threads)
        if (t.state == s) found = &t;
      return found;
    };
    if (at_barrier + done == b.threads.size()) {
      if (done > 0) {
        const Thread* exited = some(State::Done);
        stop(std::make_exception_ptr(EmulationError(fmt::format(
            "{}: __syncthreads() is divergent: {} threads wait at a barrier that {} threads of the block never reach "
            "(they exited, e.g. thread {})",
            where(b, nullptr), at_barrier, done, describe(exited->idx)))));
      }
      ++b.epoch;
      for (Thread& t : b.threads) t.state = State::Ready;
      continue;
    }
    // Some lanes wait at a warp exchange that others of their warp never reach (a barrier or an exit).
    const Thread* waiting = some(State::AtWarp);
    stop(std::make_exception_ptr(EmulationError(fmt::format(
        "{}: deadlock: the thread waits at a warp exchange (shuffle, ballot or __syncwarp) that other lanes of its "
        "warp do not reach",
        where(b, waiting)))));
  }
}

}  // namespace

void launch(const LaunchConfig& config, const std::function<void()>& body) {
  check_config(config);
  if (t_block) throw EmulationError(fmt::format("kernel {}: launched from inside another kernel", config.kernel));
  ++g_counters.launches;
  const unsigned n = unsigned(config.block.count());
  // Thread stacks are kept for the next launch on this host thread: mapping fresh ones every launch cost more
  // than the kernels (page faults). Their size is not a power of two, so that the tops of a block's stacks do
  // not all fall into the same cache sets (which made every switch between threads a cache miss).
  thread_local ctx::pooled_fixedsize_stack stacks(128 * 1024 + 17 * 64, 1024);
  // One Block, set up again for each block of the grid (its vectors keep their memory).
  Block b;
  b.config = &config;
  b.threads.resize(n);
  b.warps.resize((n + kWarpSize - 1) / kWarpSize);
  for (unsigned z = 0; z < config.grid.z; ++z)
    for (unsigned y = 0; y < config.grid.y; ++y)
      for (unsigned x = 0; x < config.grid.x; ++x) {
        b.idx = {x, y, z};
        for (unsigned i = 0; i < n; ++i) {
          Thread& t = b.threads[i];
          t = Thread{};
          t.linear = i;
          t.idx = {i % config.block.x, (i / config.block.x) % config.block.y, i / (config.block.x * config.block.y)};
        }
        for (size_t w = 0; w < b.warps.size(); ++w) {
          b.warps[w] = Warp{};
          b.warps[w].live = std::min<unsigned>(kWarpSize, n - unsigned(w) * kWarpSize);
        }
        b.dynamic.reset(new std::max_align_t[alloc_units(std::max<size_t>(config.dynamic_shared, 1))]);
        b.statics.clear();
        b.shadow.clear();
        b.epoch = 1;
        b.current = nullptr;
        t_block = &b;
        try {
          run_block(b, stacks, body);
        } catch (...) {
          t_block = nullptr;
          throw;
        }
        t_block = nullptr;
        ++g_counters.blocks;
      }
}

Counters counters() { return g_counters; }

Dim3 thread_idx() { return self().idx; }
Dim3 block_idx() { return block().idx; }
Dim3 block_dim() { return block().config->block; }
Dim3 grid_dim() { return block().config->grid; }

void sync_threads() { yield(State::AtBarrier); }

namespace {

/// Publishes `value` for the calling lane, waits for the warp, and returns the released values.
const std::array<uint32_t, kWarpSize>& exchange(uint32_t value) {
  Block& b = block();
  Thread& t = self();
  Warp& w = b.warps[t.linear / kWarpSize];
  w.posted[t.linear % kWarpSize] = value;
  yield(State::AtWarp);
  return w.released;
}

}  // namespace

void sync_warp() { exchange(0); }

uint32_t shuffle(uint32_t value, int src_lane) {
  Block& b = block();
  const Thread& t = self();
  const Warp& w = b.warps[t.linear / kWarpSize];
  if (src_lane < 0 || unsigned(src_lane) >= w.live)
    fail(fmt::format("shuffle from lane {}, which does not exist in this warp ({} live lanes)", src_lane, w.live));
  return exchange(value)[size_t(src_lane)];
}

std::array<uint32_t, kWarpSize> gather(uint32_t value, unsigned* live) {
  *live = block().warps[self().linear / kWarpSize].live;
  std::array<uint32_t, kWarpSize> all = exchange(value);
  for (unsigned lane = *live; lane < kWarpSize; ++lane) all[lane] = 0;
  return all;
}

uint32_t ballot(bool predicate) {
  const Warp& w = block().warps[self().linear / kWarpSize];
  const std::array<uint32_t, kWarpSize>& v = exchange(predicate ? 1u : 0u);
  uint32_t mask = 0;
  for (unsigned lane = 0; lane < w.live; ++lane) mask |= v[lane] << lane;
  return mask;
}

void* static_shared(const void* site, size_t bytes) {
  Block& b = block();
  auto it = b.statics.find(site);
  if (it == b.statics.end())
    it = b.statics.emplace(site, Block::Region{std::unique_ptr<std::max_align_t[]>(new std::max_align_t[alloc_units(bytes)]()), bytes})
             .first;
  else if (it->second.bytes != bytes)
    fail(fmt::format("a __shared__ array declared with {} bytes here was declared with {} bytes by another thread",
                     bytes, it->second.bytes));
  return it->second.memory.get();
}

void* dynamic_shared(size_t* bytes) {
  Block& b = block();
  *bytes = b.config->dynamic_shared;
  return b.dynamic.get();
}

void shared_access(const void* addr, size_t bytes, bool write) {
  Block& b = block();
  const int t = int(self().linear);
  const uintptr_t first = reinterpret_cast<uintptr_t>(addr) & ~uintptr_t(3);
  const uintptr_t last = reinterpret_cast<uintptr_t>(addr) + (bytes ? bytes - 1 : 0);
  for (uintptr_t word = first; word <= last; word += 4) {
    Shadow& s = b.shadow[word];
    if (s.epoch != b.epoch) s = {b.epoch, -1, -1};
    const auto race = [&](int other, const char* what) {
      fail(fmt::format("shared-memory race: this thread {} a word that thread {} {} since the last __syncthreads()",
                       write ? "writes" : "reads", describe(b.threads[size_t(other)].idx), what));
    };
    if (s.writer >= 0 && s.writer != t) race(s.writer, "wrote");
    if (write) {
      if (s.reader == -2) fail("shared-memory race: this thread writes a word that several threads read since the last "
                               "__syncthreads()");
      if (s.reader >= 0 && s.reader != t) race(s.reader, "read");
      s.writer = t;
    } else if (s.reader != t) {
      s.reader = s.reader == -1 ? t : -2;
    }
  }
}

void fail(const std::string& what) {
  Block& b = block();
  throw EmulationError(fmt::format("{}: {}", where(b, b.current), what));
}

}  // namespace choreo::cuda::emu
