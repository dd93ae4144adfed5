#pragma once
// One message being brought back to T0 (the tier manager's private state, runtime/engine/tier_loads.cc),
// from T1 (one batched copy of the backend) or from a store (a job that finishes the store's open, checks
// every page and copies them in). A call's load waits for it at once; a prefetch's runs in the background
// until it is settled.

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/engine/tiers.h"
#include "runtime/kv/tiers.h"

namespace choreo::runtime {

struct TierManager::Load {
  Source from = kT1;
  int tier = 1;             // 1, or the store's tier
  bool background = false;  // a prefetch: the job runs on a thread of its own
  kv::HostCopy host;        // T1: the copy being read, held aside so that making room in T1 cannot drop it
  kernels::Completion copy; // T1: every page, one batched copy
  // A store: finishes its open, checks the entry and reads its pages; what was wrong (nullopt: nothing; "":
  // the entry was not there after all). Run when waited for, unless `background`.
  std::future<std::optional<std::string>> job;
  std::map<int, std::vector<float>> e_cache;  // a store: the E caches of the message's layers, filled by the job
  bool entry_has_e = false;                   // a store: the entry holds E caches (of any layers)
  size_t bytes = 0;
  double start_ms = 0;  // when the load started (for --trace)

  Load() = default;
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;
  ~Load() {
    // The copy reads `host` and a background job writes pages: both must be done before those go. A job
    // that runs when waited for was never started and is dropped.
    try {
      copy.wait();
    } catch (...) {
    }
    if (background && job.valid()) job.wait();
  }
  bool finished() const {
    if (from != kT1) return job.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    return copy.ready();
  }
};

}  // namespace choreo::runtime
