#include "runtime/exec/thread_room.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace choreo::exec {

namespace {

/// The first whole number in a file ("max" and unreadable files give nothing).
std::optional<long> read_number(const std::filesystem::path& path) {
  std::ifstream in(path);
  long value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

/// The value of a "Name:\tvalue" line of /proc/self/status.
std::optional<long> status_field(const std::string& name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + ":", 0) == 0) return std::stol(line.substr(name.size() + 1));
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

}  // namespace

int thread_room(int reserved) {
  long room = kMaxConcurrency + long(std::max(reserved, 0));
  auto lower_to = [&room](std::optional<long> r) {
    if (r) room = std::min(room, *r);
  };
  rlimit nproc{};
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    const std::optional<long> own = status_field("Threads");
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
