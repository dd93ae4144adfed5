#pragma once
// A map that keeps its newest entries: the responses `choreo serve` stores for previous_response_id, and the
// names clients give messages (choreo.id).

#include <list>
#include <string>
#include <unordered_map>
#include <utility>

namespace choreo::serve {

/// Keeps the `capacity` most recently put (or used) entries; not thread-safe.
template <typename V>
class BoundedMap {
 public:
  explicit BoundedMap(size_t capacity) : capacity_(capacity) {}
  const V* find(const std::string& key) const {
    const auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->second;
  }
  /// As find, and makes the entry the newest.
  V* use(const std::string& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  void put(const std::string& key, V value) {
    if (const auto it = index_.find(key); it != index_.end()) {
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<std::string, V>> order_;
  std::unordered_map<std::string, typename std::list<std::pair<std::string, V>>::iterator> index_;
};

}  // namespace choreo::serve
