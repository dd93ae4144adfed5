#pragma once
// The block emulator (issue 14): runs CUDA kernels written against kernels/cuda/portable.h on the CPU, so that
// their logic is executed and checked on machines without a GPU. One launch runs its blocks one after the
// other; each block's threads are cooperative user-space threads (Boost.Context fibers) scheduled round-robin,
// each running until it finishes or waits at a rendezvous:
// - `__syncthreads()` waits until every thread of the block has arrived; a thread that exits while others
//   wait at a barrier is an error (the barrier would be divergent);
// - warp exchanges (shuffles, ballots, `__syncwarp`) wait until every live lane of the warp has arrived, and
//   read the values the lanes published for that exchange;
// - shared memory is a buffer per block; every access through portable.h's `Shared` is bounds-checked and
//   seen by a race detector: two threads of a block touching one shared word between two barriers, one of
//   them writing, is an error (warp exchanges do not order shared-memory accesses here: warp-synchronous
//   shared-memory code needs `__syncwarp`'s memory ordering, which the detector does not model);
// - global memory is reached through portable.h's `Ptr`, bounds-checked against its allocation;
// - atomics are sequentially consistent (one thread runs at a time).
// An error stops the launch with an EmulationError naming the kernel, the block, the thread and the access.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace choreo::cuda {

/// Launch geometry (CUDA's dim3).
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3() = default;
  constexpr Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr uint64_t count() const { return uint64_t(x) * y * z; }
};

inline constexpr int kWarpSize = 32;

namespace emu {

class EmulationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchConfig {
  std::string kernel;  // for messages
  Dim3 grid, block;
  size_t dynamic_shared = 0;  // bytes
};

/// Checks the configuration as CUDA does (at most 1024 threads per block, block.z <= 64, grid.y and grid.z
/// <= 65535, grid.x < 2^31, dynamic shared memory <= 227 KiB), then runs `body` once per thread of every block.
void launch(const LaunchConfig& config, const std::function<void()>& body);

/// How many launches, blocks and thread switches ran (tests and reports).
struct Counters {
  uint64_t launches = 0, blocks = 0, switches = 0;
};
Counters counters();

// ---- What kernel code reaches through portable.h (valid only inside launch()) ----------------------------

Dim3 thread_idx();
Dim3 block_idx();
Dim3 block_dim();
Dim3 grid_dim();
void sync_threads();
void sync_warp();
/// The 32-bit word lane `src` of the calling warp published at this exchange.
uint32_t shuffle(uint32_t value, int src_lane);
/// Every live lane's 32-bit word of this exchange (lanes past `*live` hold 0).
std::array<uint32_t, kWarpSize> gather(uint32_t value, unsigned* live);
/// Bit i set when lane i's predicate is true, over the warp's live lanes.
uint32_t ballot(bool predicate);
/// The region of a static `__shared__` array declared at `site` (every thread of a block gets the same one).
void* static_shared(const void* site, size_t bytes);
/// The block's dynamic shared memory and its size.
void* dynamic_shared(size_t* bytes);
/// Records a shared-memory access for the race detector (`bytes` at `addr`, a write or a read).
void shared_access(const void* addr, size_t bytes, bool write);
/// Stops the launch: an EmulationError with `what` and where it happened (kernel, block, thread).
[[noreturn]] void fail(const std::string& what);

}  // namespace emu
}  // namespace choreo::cuda
