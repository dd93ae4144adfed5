#pragma once
// GET /metrics of `choreo serve`, in the Prometheus text exposition format: requests by endpoint and status,
// prompt tokens by where they came from, generated tokens, and TTFT and end-to-end histograms. The engine's
// gauges (T0 occupancy, sessions) are added by the server when it renders.

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

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
  void generation(int prompt_tokens, int reused, int computed, int generated, double ttft_s, double total_s);
  /// The text of GET /metrics; `gauges` are extra lines (already formatted).
  std::string render(const std::string& gauges) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, reused_ = 0, computed_ = 0, generated_ = 0;
  Histogram ttft_, total_;
};

}  // namespace choreo::serve
