#include "kernels/cpu/pages.h"

#include <algorithm>

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "kernels/cpu/elementwise.h"

namespace choreo::kernels::cpu {

PageTable::~PageTable() {
  for (std::atomic<Slot*>& chunk : dir_) {
    Slot* slots = chunk.load();
    if (!slots) continue;
    for (size_t i = 0; i < kChunk; ++i) std::free(slots[i].data);
    delete[] slots;
  }
}

PageId PageTable::allocate(size_t bytes) {
  std::lock_guard lock(mutex_);
  PageId id;
  auto it = free_.find(bytes);
  if (it != free_.end() && !it->second.empty()) {
    id = it->second.back();
    it->second.pop_back();
  } else {
    if (n_ids_ == kChunks * kChunk) throw std::bad_alloc();
    id = n_ids_;
    Slot* slots = dir_[id >> kChunkBits].load(std::memory_order_relaxed);
    if (!slots) {
      slots = new Slot[kChunk];
      dir_[id >> kChunkBits].store(slots, std::memory_order_release);
    }
    auto* data = static_cast<std::byte*>(std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64)));
    if (!data) throw std::bad_alloc();
    slots[id & (kChunk - 1)] = {data, bytes};
    n_ids_.store(id + 1, std::memory_order_release);
  }
  std::memset(get(id), 0, bytes);
  return id;
}

void PageTable::free(PageId page) {
  std::lock_guard lock(mutex_);
  free_[bytes_of(page)].push_back(page);
}

void PageTable::check_range(PageId page, ByteRange range) const {
  if (page >= n_ids_.load(std::memory_order_acquire))
    throw std::out_of_range("KV page " + std::to_string(page) + " was not allocated by this backend");
  if (range.offset > bytes_of(page) || range.bytes > bytes_of(page) - range.offset)
    throw std::out_of_range("KV page copy outside the page");
}

CopyWorker::~CopyWorker() {
  if (!state_) return;
  if (pid_ != ::getpid()) {
    (void)state_.release();  // a forked copy: the thread it names does not exist in this process
    return;
  }
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
}

Completion CopyWorker::submit(std::function<void()> job) {
  std::promise<void> done;
  Completion completion(done.get_future().share());
  State* state;
  {
    std::lock_guard start(start_mutex_);
    if (!state_ || pid_ != ::getpid()) {
      if (state_) (void)state_.release();  // inherited through fork: abandoned, see the class comment
      state_ = std::make_unique<State>();
      pid_ = ::getpid();
      state_->thread = std::thread([s = state_.get()] { run(*s); });
    }
    state = state_.get();
  }
  {
    std::lock_guard lock(state->mutex);
    state->jobs.emplace_back(std::move(job), std::move(done));
  }
  state->wake.notify_one();
  return completion;
}

void CopyWorker::run(State& state) {
  for (;;) {
    std::pair<std::function<void()>, std::promise<void>> job;
    {
      std::unique_lock lock(state.mutex);
      state.wake.wait(lock, [&] { return state.stop || !state.jobs.empty(); });
      if (state.jobs.empty()) return;  // stopping, and every job submitted has run
      job = std::move(state.jobs.front());
      state.jobs.pop_front();
    }
    try {
      job.first();
      job.second.set_value();
    } catch (...) {
      job.second.set_exception(std::current_exception());
    }
  }
}

void rerotate_keys(const PageTable& table, const KvLayout& kv, std::span<const PageId> from,
                   std::span<const PageId> to, int n_tokens, int delta, const RopeParams& rope_params) {
  check_rerotate(kv, from, to, n_tokens);
  const ByteRange whole{0, kv.page_bytes()};
  for (size_t i = 0; i < to.size(); ++i) {
    table.check_range(from[i], whole);
    table.check_range(to[i], whole);
  }
  for (size_t i = 0; i < to.size(); ++i)
    if (to[i] != from[i]) std::memcpy(table.get(to[i]), table.get(from[i]), whole.bytes);
  // A page's keys of one layer at a time, as rows: cpu::rope rotates each row as it rotates a row alone.
  const size_t kv_dim = size_t(kv.kv_dim());
  std::vector<float> rows(size_t(kv.page_tokens) * kv_dim);
  const std::vector<int32_t> positions(size_t(kv.page_tokens), delta);
  for (size_t p = 0; p * size_t(kv.page_tokens) < size_t(n_tokens); ++p) {
    std::byte* page = table.get(to[p]);
    const int n = std::min(kv.page_tokens, n_tokens - int(p) * kv.page_tokens);
    for (int layer = 0; layer < kv.n_layers; ++layer) {
      for (int slot = 0; slot < n; ++slot) kv.read_k(page, layer, slot, rows.data() + size_t(slot) * kv_dim);
      rope(rows.data(), n, kv.n_kv_heads, kv.head_dim, positions.data(), rope_params);
      for (int slot = 0; slot < n; ++slot) kv.write_k(page, layer, slot, rows.data() + size_t(slot) * kv_dim);
    }
  }
}

}  // namespace choreo::kernels::cpu
