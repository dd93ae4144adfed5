#pragma once
// How many worker threads a many-instance run may start (`--concurrency`): a fixed maximum, lowered to the
// room the process limits leave, for threads (thread_room) and for the address space their stacks and
// allocations take (memory_room). A limit that cannot be read in advance (other processes of the same user)
// shows up when a thread cannot be started; BatchScheduler then stops with a RuntimeFailure instead of
// running with part of its workers.

#include <cstdint>

namespace choreo::exec {

/// The largest `--concurrency` accepted at all: instances in flight at once, one thread each.
inline constexpr int kMaxConcurrency = 4096;

/// Address space a worker is counted at besides its stack (memory_room): what its instance allocates
/// (its plan, values and results, its share of the engine's batch buffers).
inline constexpr uint64_t kInstanceBytes = uint64_t(16) << 20;

/// Threads this process can still start as far as it can tell, at most kMaxConcurrency: the least room left
/// by RLIMIT_NPROC (unless running as root, whom the kernel exempts; only this process's own threads are
/// counted against it), by kernel.threads-max and kernel.pid_max (against every task on the machine) and by
/// the pids.max of this process's cgroups. `reserved` threads of that room are kept for others (the compute
/// kernels' threads).
int thread_room(int reserved);

/// Worker threads the address-space limits leave room for, at most kMaxConcurrency: RLIMIT_AS (ulimit -v)
/// counts every mapping, RLIMIT_DATA (ulimit -d) the writable private ones, thread stacks included. A worker
/// costs its stack (the default pthread stack size, from ulimit -s) and kInstanceBytes, and, while glibc is
/// below its limit of malloc arenas (8 per CPU unless MALLOC_ARENA_MAX says otherwise), a new arena's 64 MiB
/// of address space (not of data); the reserve of common/memory_limits.h stays free. Unlimited limits leave
/// kMaxConcurrency.
int memory_room();

}  // namespace choreo::exec
