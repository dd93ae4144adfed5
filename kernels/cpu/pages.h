#pragma once
// KV page memory of the CPU backend: page ids resolved through a two-level table that never moves, so kernels
// resolve ids without a lock while other threads allocate; the copy worker that runs the backend's
// asynchronous copies between pages and host memory; and key re-rotation over a page list.

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"

namespace choreo::kernels::cpu {

class PageTable {
 public:
  PageTable() = default;
  ~PageTable();
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  /// A zeroed page of `bytes` bytes (64-byte aligned), recycled from freed pages of that size when there are.
  PageId allocate(size_t bytes);
  void free(PageId page);
  std::byte* get(PageId page) const {
    return dir_[page >> kChunkBits].load(std::memory_order_acquire)[page & (kChunk - 1)].data;
  }
  size_t bytes_of(PageId page) const {
    return dir_[page >> kChunkBits].load(std::memory_order_acquire)[page & (kChunk - 1)].bytes;
  }
  /// Throws std::out_of_range unless the page was allocated here and `range` lies within it.
  void check_range(PageId page, ByteRange range) const;

 private:
  struct Slot {
    std::byte* data = nullptr;
    size_t bytes = 0;
  };
  static constexpr int kChunkBits = 12;
  static constexpr size_t kChunk = size_t(1) << kChunkBits;
  static constexpr size_t kChunks = 4096;  // 16M pages
  std::array<std::atomic<Slot*>, kChunks> dir_{};
  std::mutex mutex_;
  std::atomic<uint32_t> n_ids_ = 0;  // written under mutex_, read by check_range without it
  std::unordered_map<size_t, std::vector<PageId>> free_;  // by page size
};

/// One worker thread, started on first use, that runs jobs in order; each job's completion is a future.
/// A process forked from one with a worker has no such thread: its first submit starts its own (the
/// parent's worker state, possibly locked at the fork, is left untouched).
class CopyWorker {
 public:
  CopyWorker() = default;
  ~CopyWorker();
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;
  Completion submit(std::function<void()> job);

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::pair<std::function<void()>, std::promise<void>>> jobs;
    bool stop = false;
    std::thread thread;
  };
  static void run(State& state);
  std::mutex start_mutex_;
  std::unique_ptr<State> state_;
  int pid_ = 0;  // the process that started the worker
};

/// Backend::rerotate_keys on the table's pages: the pages of `to` that are not their `from` page copied from
/// it, then each layer's keys of a page decoded (KvLayout::read_k), rotated by cpu::rope at position delta and
/// encoded again (KvLayout::write_k). The arguments are checked first (check_rerotate, and every page of
/// the layout's size: std::out_of_range).
void rerotate_keys(const PageTable& table, const KvLayout& kv, std::span<const PageId> from,
                   std::span<const PageId> to, int n_tokens, int delta, const RopeParams& rope);

}  // namespace choreo::kernels::cpu
