// The one clock of choreo's timings and traces: milliseconds on the steady clock. Time stamps that are
// compared or drawn together (call spans, KV tier events, `ttl` hints, TTFT) all come from here.
#pragma once

#include <chrono>

namespace choreo {

inline double steady_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace choreo
