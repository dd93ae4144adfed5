#pragma once
// A map that keeps its newest entries: the responses `choreo serve` stores for previous_response_id, and the
// names clients give messages (choreo.id).

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>

namespace choreo::serve {

/// Keeps the `capacity` most recently put (or used) entries, and no more than `max_bytes` of them by the sizes
/// put() is told (the newest entry is kept even when it alone is larger); not thread-safe.
template <typename V>
class BoundedMap {
 public:
  explicit BoundedMap(size_t capacity, size_t max_bytes = SIZE_MAX) : capacity_(capacity), max_bytes_(max_bytes) {}
  const V* find(const std::string& key) const {
    const auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->value;
  }
  /// As find, and makes the entry the newest.
  V* use(const std::string& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->value;
  }
  void put(const std::string& key, V value, size_t bytes = 0) {
    if (const auto it = index_.find(key); it != index_.end()) {
      bytes_ -= it->second->bytes;
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.push_front({key, std::move(value), bytes + key.size()});
    bytes_ += order_.front().bytes;
    index_[key] = order_.begin();
    while (order_.size() > capacity_ || (bytes_ > max_bytes_ && order_.size() > 1)) {
      bytes_ -= order_.back().bytes;
      index_.erase(order_.back().key);
      order_.pop_back();
    }
  }
  /// The bytes of the entries kept, as put() was told (with their keys).
  size_t bytes() const { return bytes_; }
  size_t size() const { return order_.size(); }

 private:
  struct Entry {
    std::string key;
    V value;
    size_t bytes;
  };
  size_t capacity_, max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> order_;
  std::unordered_map<std::string, typename std::list<Entry>::iterator> index_;
};

}  // namespace choreo::serve
