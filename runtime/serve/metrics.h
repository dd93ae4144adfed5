#pragma once
// GET /metrics of `choreo serve`, in the Prometheus text exposition format: requests by endpoint and status,
// prompt tokens by where they came from, generated tokens, and TTFT and end-to-end histograms. The engine's
// gauges (T0 occupancy, sessions, the KV tiers) are added by the server when it renders.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/kv/tiers.h"
#include "runtime/serve/request.h"

namespace choreo::serve {

/// A cumulative histogram of seconds.
class Histogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  void observe(double seconds);
  /// Its lines, named `name`.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::array<uint64_t, kBounds.size()> counts_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

/// What the server counts; safe to use from any request thread.
class Metrics {
 public:
  void request(const std::string& endpoint, int status);
  void generation(const PromptUsage& usage, int generated, double ttft_s, double total_s);
  /// The text of GET /metrics; `gauges` are extra lines (already formatted).
  std::string render(const std::string& gauges) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  // Prompt tokens by where their KV came from, summed over generations.
  uint64_t prefix_reused_ = 0, out_of_prefix_ = 0, computed_ = 0, recomputed_ = 0, generated_ = 0;
  std::array<uint64_t, 4> loaded_{};  // by tier (1-3)
  Histogram ttft_, total_;
};

/// The KV tiers' lines of GET /metrics: T1's occupancy, and what the tiers did (evictions, offloads, loads and
/// writes per tier, prefetches, recomputations).
std::string render_tiers(const kv::TierStats& stats, size_t t1_in_use_bytes, size_t t1_budget_bytes);

}  // namespace choreo::serve
