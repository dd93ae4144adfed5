#include "runtime/exec/thread_room.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "common/memory_limits.h"

namespace choreo::exec {

namespace {

/// The first whole number in a file ("max" and unreadable files give nothing).
std::optional<long> read_number(const std::filesystem::path& path) {
  std::ifstream in(path);
  long value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

/// Tasks (threads) on the machine: the total of /proc/loadavg's "running/total" field.
std::optional<long> machine_tasks() {
  std::ifstream in("/proc/loadavg");
  std::string load1, load5, load15, tasks;
  if (!(in >> load1 >> load5 >> load15 >> tasks)) return std::nullopt;
  const size_t slash = tasks.find('/');
  if (slash == std::string::npos) return std::nullopt;
  return std::stol(tasks.substr(slash + 1));
}

/// The least pids.max - pids.current over this process's pids cgroups and their ancestors (v1 and v2).
std::optional<long> cgroup_room() {
  std::optional<long> room;
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2, unified) or "N:pids:/path" (v1).
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::filesystem::path root;
    if (controllers.empty())
      root = "/sys/fs/cgroup";
    else if (("," + controllers + ",").find(",pids,") != std::string::npos)
      root = "/sys/fs/cgroup/pids";
    else
      continue;
    for (std::filesystem::path group = std::filesystem::path(line.substr(second + 1)).relative_path();;
         group = group.parent_path()) {
      const std::optional<long> max = read_number(root / group / "pids.max");
      const std::optional<long> current = read_number(root / group / "pids.current");
      if (max && current) room = std::min(room.value_or(*max - *current), *max - *current);
      if (group.empty()) break;
    }
  }
  return room;
}

/// Address space glibc reserves for each malloc arena past the main one (HEAP_MAX_SIZE on 64-bit systems).
constexpr uint64_t kArenaBytes = uint64_t(64) << 20;

/// Bytes a new thread's stack takes: the default stack size (set from ulimit -s) and its guard.
uint64_t default_stack_bytes() {
  pthread_attr_t attr;
  size_t stack = size_t(8) << 20, guard = 4096;
  if (::pthread_getattr_default_np(&attr) == 0) {
    ::pthread_attr_getstacksize(&attr, &stack);
    ::pthread_attr_getguardsize(&attr, &guard);
    ::pthread_attr_destroy(&attr);
  }
  return uint64_t(stack) + uint64_t(guard);
}

/// glibc's limit on malloc arenas: MALLOC_ARENA_MAX, else 8 per CPU (the larger of the CPUs online and those
/// this process may run on, to count high).
long arena_limit() {
  if (const char* max = std::getenv("MALLOC_ARENA_MAX"); max && std::atol(max) > 0) return std::atol(max);
  cpu_set_t set;
  long cpus = ::get_nprocs();
  if (::sched_getaffinity(0, sizeof set, &set) == 0) cpus = std::max<long>(cpus, CPU_COUNT(&set));
  return 8 * std::max(cpus, 1L);
}

}  // namespace

int memory_room() {
  const AddressSpaceLeft left = address_space_left();
  if (!left.limited()) return kMaxConcurrency;
  const uint64_t per_worker = default_stack_bytes() + kInstanceBytes;
  // Threads that exist already (the compute kernels') hold arenas of their own, the main thread the main one.
  const long others = std::max(proc_status_field("Threads").value_or(1) - 1, 0L);
  const long limit = arena_limit();
  for (int n = 1; n <= kMaxConcurrency; ++n) {
    const uint64_t data = uint64_t(n) * per_worker + left.reserve_bytes;
    const long new_arenas = std::max(std::min(others + n, limit) - std::min(others, limit), 0L);
    const uint64_t arenas = uint64_t(new_arenas) * kArenaBytes;
    if ((left.address_bytes && data + arenas > *left.address_bytes) ||
        (left.data_bytes && data > *left.data_bytes))
      return n - 1;
  }
  return kMaxConcurrency;
}

int thread_room(int reserved) {
  long room = kMaxConcurrency + long(std::max(reserved, 0));
  auto lower_to = [&room](std::optional<long> r) {
    if (r) room = std::min(room, *r);
  };
  rlimit nproc{};
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    const std::optional<long> own = proc_status_field("Threads");
    lower_to(long(std::min<rlim_t>(nproc.rlim_cur, kMaxConcurrency * 16L)) - own.value_or(1));
  }
  if (const std::optional<long> tasks = machine_tasks()) {
    if (const std::optional<long> max = read_number("/proc/sys/kernel/threads-max")) lower_to(*max - *tasks);
    if (const std::optional<long> max = read_number("/proc/sys/kernel/pid_max")) lower_to(*max - *tasks);
  }
  lower_to(cgroup_room());
  return int(std::clamp<long>(room - std::max(reserved, 0), 0, kMaxConcurrency));
}

}  // namespace choreo::exec
