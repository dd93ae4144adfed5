#include "runtime/engine/stop_strings.h"

#include <algorithm>

namespace choreo::runtime {

size_t find_stop(std::string_view text, std::span<const std::string> stops) {
  size_t first = std::string_view::npos;
  for (const std::string& s : stops)
    if (!s.empty()) first = std::min(first, text.find(s));
  return first;
}

StopScanner::StopScanner(std::span<const std::string> stops) {
  for (const std::string& s : stops)
    if (!s.empty()) stops_.push_back(s);
  for (const std::string& s : stops_) keep_bytes_ = std::max(keep_bytes_, s.size() - 1);
}

bool StopScanner::append(std::string_view piece) {
  if (found_ || stops_.empty()) return found_;
  tail_.append(piece);
  found_ = find_stop(tail_, stops_) != std::string::npos;
  if (tail_.size() > keep_bytes_) tail_.erase(0, tail_.size() - keep_bytes_);
  return found_;
}

}  // namespace choreo::runtime
