#pragma once
// A prefetch in flight (runtime/engine/prefetch.cc): the engine's private state for one message being
// brought back to T0 in the background.

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/tiers.h"
#include "runtime/store/disk_store.h"

namespace choreo::runtime {

struct Engine::Loading {
  int tier = 0;                             // 1: from T1, 2: from T2, 3: from T3
  kv::HostCopy host;                        // T1: the copy being read, held aside so T1 cannot drop it
  kernels::Completion copy;                 // T1: every page, one batched copy
  std::optional<store::MappedEntry> entry;  // T2: the entry the job reads
  // T2, T3: reads (T3), checks and copies every page, and takes the E caches the message saves; what was
  // wrong (nullopt: nothing; "": a T3 miss).
  std::future<std::optional<std::string>> job;
  std::map<int, std::vector<float>> e_cache;  // T2, T3: filled by the job
  size_t bytes = 0;
  double start_ms = 0;  // when the load started (for --trace)

  Loading() = default;
  Loading(const Loading&) = delete;
  Loading& operator=(const Loading&) = delete;
  ~Loading() {
    // The copy reads `host` and the job reads `entry`: both must be done before those go.
    try {
      copy.wait();
    } catch (...) {
    }
    if (job.valid()) job.wait();
  }
  bool finished() const {
    if (tier >= 2) return job.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    return copy.ready();
  }
};

}  // namespace choreo::runtime
