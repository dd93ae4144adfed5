#pragma once
// Pinned host memory for the KV tiers' copies (T1), handed out from a few large allocations (issue 14).
// Pinning is slow (cudaHostAlloc maps and locks every page, and the driver serialises it), so one pinned
// allocation per evicted message, as T1 makes them, would cost more than the copy it serves. The pool asks
// the device for chunks of at least kChunkBytes, hands out 64-byte-aligned ranges of them first fit, merges
// a released range with its free neighbours, and gives a chunk back once it is wholly free (keeping one idle
// chunk, so that a message evicted and reloaded in turn does not pin and unpin a chunk each time).
// Host logic only: the same code runs with the emulated device and with CUDA (backend_core.h), and alone in
// tests with any allocator.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace choreo::cuda {

class PinnedPool {
 public:
  static constexpr size_t kChunkBytes = size_t(16) << 20;
  static constexpr size_t kAlign = 64;

  /// `allocate(bytes)` returns pinned memory (64-byte aligned) or throws; `release(p)` frees it.
  PinnedPool(std::function<void*(size_t)> allocate, std::function<void(void*)> release, size_t chunk_bytes = kChunkBytes)
      : allocate_(std::move(allocate)), release_(std::move(release)), chunk_bytes_(chunk_bytes) {}
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  ~PinnedPool() {
    for (auto& [start, chunk] : chunks_) release_(reinterpret_cast<void*>(start));
  }

  /// `bytes` (at least 1) of pinned memory, 64-byte aligned.
  void* alloc(size_t bytes) {
    const size_t size = round_up(bytes == 0 ? 1 : bytes);
    std::lock_guard lock(mutex_);
    for (auto& [start, chunk] : chunks_)
      if (void* p = take(start, chunk, size)) return p;
    const size_t chunk_size = std::max(size, chunk_bytes_);
    void* memory = allocate_(chunk_size);
    const uintptr_t start = reinterpret_cast<uintptr_t>(memory);
    Chunk& chunk = chunks_.emplace(start, Chunk{chunk_size, {{0, chunk_size}}, {}}).first->second;
    return take(start, chunk, size);
  }

  /// Returns memory alloc gave (std::logic_error for anything else).
  void release(void* p) {
    std::lock_guard lock(mutex_);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    const auto it = chunk_at(chunks_, at);
    if (it == chunks_.end()) throw std::logic_error("release_host: memory the pinned pool did not hand out");
    Chunk& chunk = it->second;
    const auto used = chunk.used.find(at - it->first);
    if (used == chunk.used.end()) throw std::logic_error("release_host: memory the pinned pool did not hand out");
    size_t offset = used->first, size = used->second;
    chunk.used.erase(used);
    // Merge with the free ranges on either side.
    auto next = chunk.free.lower_bound(offset);
    if (next != chunk.free.end() && next->first == offset + size) {
      size += next->second;
      next = chunk.free.erase(next);
    }
    if (next != chunk.free.begin()) {
      auto before = std::prev(next);
      if (before->first + before->second == offset) {
        offset = before->first;
        size += before->second;
        chunk.free.erase(before);
      }
    }
    chunk.free.emplace(offset, size);
    if (chunk.used.empty()) {
      // Wholly free: give it back unless it is the only idle chunk.
      size_t idle = 0;
      for (const auto& [start, c] : chunks_) idle += c.used.empty() ? 1 : 0;
      if (idle > 1) {
        release_(reinterpret_cast<void*>(it->first));
        chunks_.erase(it);
      }
    }
  }

  /// Whether [p, p + bytes) lies within one range this pool handed out and has not taken back.
  bool owns(const void* p, size_t bytes) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    std::lock_guard lock(mutex_);
    const auto it = chunk_at(chunks_, at);
    if (it == chunks_.end()) return false;
    const Chunk& chunk = it->second;
    const size_t offset = at - it->first;
    if (offset >= chunk.bytes) return false;
    auto used = chunk.used.upper_bound(offset);
    if (used == chunk.used.begin()) return false;
    --used;
    return offset + bytes <= used->first + used->second;
  }

  /// Chunks held now (pinned allocations of the device), and their bytes.
  size_t chunks() const {
    std::lock_guard lock(mutex_);
    return chunks_.size();
  }
  size_t pinned_bytes() const {
    std::lock_guard lock(mutex_);
    size_t total = 0;
    for (const auto& [start, c] : chunks_) total += c.bytes;
    return total;
  }

 private:
  struct Chunk {
    size_t bytes = 0;
    std::map<size_t, size_t> free;  // offset -> bytes, disjoint and never adjacent
    std::map<size_t, size_t> used;  // offset -> bytes handed out
  };
  static size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  /// The chunk that can hold address `at`: the last one starting at or below it (end() if none does).
  template <class Chunks>
  static auto chunk_at(Chunks& chunks, uintptr_t at) -> decltype(chunks.begin()) {
    auto it = chunks.upper_bound(at);
    return it == chunks.begin() ? chunks.end() : std::prev(it);
  }
  /// First fit in one chunk, or null.
  static void* take(uintptr_t start, Chunk& chunk, size_t size) {
    for (auto it = chunk.free.begin(); it != chunk.free.end(); ++it) {
      if (it->second < size) continue;
      const auto [offset, bytes] = *it;
      chunk.free.erase(it);
      if (bytes > size) chunk.free.emplace(offset + size, bytes - size);
      chunk.used.emplace(offset, size);
      return reinterpret_cast<void*>(start + offset);
    }
    return nullptr;
  }

  std::function<void*(size_t)> allocate_;
  std::function<void(void*)> release_;
  size_t chunk_bytes_;
  mutable std::mutex mutex_;
  std::map<uintptr_t, Chunk> chunks_;  // start -> chunk
};

}  // namespace choreo::cuda
