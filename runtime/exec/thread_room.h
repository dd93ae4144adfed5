#pragma once
// How many worker threads a many-instance run may start (`--concurrency`): a fixed maximum, lowered to the
// room the process limits leave. A limit that cannot be read in advance (memory for the workers' stacks,
// other processes of the same user) shows up when a thread cannot be started; BatchScheduler then stops
// with a RuntimeFailure instead of running with part of its workers.

namespace choreo::exec {

/// The largest `--concurrency` accepted at all: instances in flight at once, one thread each.
inline constexpr int kMaxConcurrency = 4096;

/// Threads this process can still start as far as it can tell, at most kMaxConcurrency: the least room left
/// by RLIMIT_NPROC (unless running as root, whom the kernel exempts; only this process's own threads are
/// counted against it), by kernel.threads-max and kernel.pid_max (against every task on the machine) and by
/// the pids.max of this process's cgroups. `reserved` threads of that room are kept for others (the compute
/// kernels' threads).
int thread_room(int reserved);

}  // namespace choreo::exec
