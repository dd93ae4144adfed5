#pragma once
// The CUDA backend's KV pages (tier 0): page arenas (one device allocation per page size, indexed by page
// number, grown by doubling so that page ids never change), single-page copies, key re-rotation
// (kernels/cuda/kernels/rerotate.cuh), and the batched tier copies (gather and scatter,
// kernels/cuda/kernels/pages.cuh) through transfer buffers and pinned staging.
// Part of CoreBackend (kernels/cuda/backend_core.h), the CUDA backend's host logic: compiled by nvcc for a GPU
// and by the host compiler for the block emulator.

#include "kernels/cuda/backend_core.h"
#include "kernels/cuda/kernels/pages.cuh"
#include "kernels/cuda/kernels/rerotate.cuh"

namespace choreo::cuda {

template <class Device>
auto CoreBackend<Device>::alloc_page(size_t bytes) -> PageId {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(arenas_.begin(), arenas_.end(), [&](const Arena& a) { return a.page_bytes == bytes; });
  if (it == arenas_.end()) {
    if (arenas_.size() == kMaxArenas) throw std::bad_alloc();
    arenas_.push_back(Arena{bytes, (bytes + sizeof(float) - 1) / sizeof(float)});
    it = arenas_.end() - 1;
  }
  Arena& a = *it;
  uint32_t index;
  if (!a.free.empty()) {
    index = a.free.back();
    a.free.pop_back();
  } else {
    if (a.n_pages == kPagesPerArena) throw std::bad_alloc();
    if (a.n_pages == a.capacity) grow(a);
    index = a.n_pages++;
  }
  dev_->zero(a.memory + size_t(index) * a.page_floats, a.page_floats * sizeof(float));
  return PageId(uint32_t(it - arenas_.begin()) << kIndexBits | index);
}

template <class Device>
void CoreBackend<Device>::free_page(PageId page) {
  std::lock_guard lock(mutex_);
  arena_of(page).free.push_back(page & kIndexMask);
}

template <class Device>
void CoreBackend<Device>::grow(Arena& a) {
  uint32_t capacity = std::min<uint32_t>(kPagesPerArena, std::max<uint32_t>(16, 2 * a.capacity));
  const size_t budget_pages = kv_budget_ / a.page_bytes;
  if (budget_pages > a.capacity) capacity = uint32_t(std::min<size_t>(capacity, budget_pages));
  float* memory = static_cast<float*>(device_alloc(size_t(capacity) * a.page_floats * sizeof(float)));
  if (a.memory) {
    dev_->synchronize();  // tier copies may be in flight from or to the old memory
    dev_->copy(memory, a.memory, size_t(a.n_pages) * a.page_floats * sizeof(float));
    dev_->release(a.memory);
  }
  a.memory = memory;
  a.capacity = capacity;
}

template <class Device>
auto CoreBackend<Device>::arena_of(PageId page) -> Arena& {
  const size_t arena = page >> kIndexBits;
  if (arena >= arenas_.size() || (page & kIndexMask) >= arenas_[arena].n_pages)
    throw std::out_of_range("page " + std::to_string(page) + " was not allocated by this backend");
  return arenas_[arena];
}

template <class Device>
auto CoreBackend<Device>::arena_for(const KvLayout& kv, PageId page) -> Arena& {
  Arena& a = arena_of(page);
  if (a.page_bytes != kv.page_bytes())
    throw std::logic_error("page " + std::to_string(page) + " holds " + std::to_string(a.page_bytes) +
                           " bytes, the KV layout's pages " + std::to_string(kv.page_bytes()));
  return a;
}

template <class Device>
uint32_t CoreBackend<Device>::page_in(Arena& a, PageId page) {
  if (&arena_of(page) != &a) throw std::logic_error("attention: pages of different sizes in one call");
  return page & kIndexMask;
}

template <class Device>
std::byte* CoreBackend<Device>::page_bytes(PageId page, ByteRange range) {
  Arena& a = arena_of(page);
  if (range.offset > a.page_bytes || range.bytes > a.page_bytes - range.offset)
    throw std::out_of_range("bytes [" + std::to_string(range.offset) + ", " + std::to_string(range.offset + range.bytes) +
                            ") are outside page " + std::to_string(page) + " of " + std::to_string(a.page_bytes) + " bytes");
  return reinterpret_cast<std::byte*>(a.memory + size_t(page & kIndexMask) * a.page_floats) + range.offset;
}

template <class Device>
void CoreBackend<Device>::copy_page(PageId dst, PageId src, ByteRange range) {
  std::lock_guard lock(mutex_);
  std::byte* to = page_bytes(dst, range);
  dev_->copy(to, page_bytes(src, range), range.bytes);
}

template <class Device>
auto CoreBackend<Device>::copy_to_host(PageId src, ByteRange range, void* dst) -> Completion {
  std::lock_guard lock(mutex_);
  return dev_->to_host_async(dst, page_bytes(src, range), range.bytes);
}

template <class Device>
auto CoreBackend<Device>::copy_from_host(const void* src, PageId dst, ByteRange range) -> Completion {
  std::lock_guard lock(mutex_);
  return dev_->from_host_async(page_bytes(dst, range), src, range.bytes);
}

template <class Device>
void CoreBackend<Device>::rerotate_keys(const KvLayout& kv, std::span<const PageId> from, std::span<const PageId> to,
                                        int n_tokens, int delta, const choreo::kernels::RopeParams& rope) {
  choreo::kernels::check_rerotate(kv, from, to, n_tokens);
  if (to.empty()) return;
  require_types(kv);
  // A key row in shared memory: beyond the 48 KiB a launch gets without an opt-in (kv_dim 12,288) not taken.
  const size_t row_bytes = size_t(kv.kv_dim()) * sizeof(float);
  if (row_bytes > 48 * 1024)
    throw_input_error("key re-rotation of " + std::to_string(kv.kv_dim()) + " key values per token is above the CUDA kernel's " +
                      std::to_string(48 * 1024 / sizeof(float)));
  std::lock_guard lock(mutex_);
  Arena& a = arena_for(kv, to[0]);
  std::vector<int32_t> index(to.size());
  for (size_t i = 0; i < to.size(); ++i) {
    arena_for(kv, from[i]);
    index[i] = int32_t(page_in(a, to[i]));
  }
  const ByteRange whole{0, a.page_bytes};
  for (size_t i = 0; i < to.size(); ++i)
    if (to[i] != from[i]) dev_->copy(page_bytes(to[i], whole), page_bytes(from[i], whole), whole.bytes);
  if (n_tokens == 0) return;
  Staging st(*this);
  const size_t at_index = st.add(std::span<const int32_t>(index));
  const std::optional<size_t> at_factors = stage_factors(st, rope);
  st.commit();
  cu::launch("rerotate_keys", kernels::rerotate_keys, Dim3(unsigned(n_tokens), unsigned(kv.n_layers)), Dim3(128), row_bytes,
             dev_->stream(), pool(a), cache_args(kv, 0), st.template get<int32_t>(at_index, index.size()), delta,
             rope_args(rope), factors(st, rope, at_factors));
  dev_->launched("rerotate_keys");
}

// ---- Batched tier copies: page gather / scatter (kernels/cuda/kernels/pages.cuh) ----
// Both go to the copy stream, after the compute work issued so far (the page numbers' upload, the first
// copy, waits for it: from_host_async), so compute never waits for them. A download gathers the pieces into
// a transfer buffer, then makes one device-to-host copy; an upload makes one host-to-device copy, then
// scatters. The transfer buffer (page numbers, then pieces) is not reused until the Completion is done.
// The host side of the device copy is always pinned: when the caller's memory is not the pinned pool's (a
// T2 entry's mapped file, a value read from Redis, a buffer written to T2 or T3), the pieces go through a
// staging range of the pool, filled before the upload (on the calling thread, outside the backend's lock)
// or emptied into the caller's memory by a host callback on the copy stream after the download. A staging
// range goes back to the pool once its copy is done (at the next batched copy, or with the backend).
template <class Device>
auto CoreBackend<Device>::copy_pages_to_host(std::span<const PageId> pages, ByteRange range, void* dst) -> Completion {
  Staged staged = stage(dst, pages.size() * range.bytes, nullptr);
  std::lock_guard lock(mutex_);
  PageRuns runs = page_runs(pages, range);
  if (runs.data_bytes == 0) return {};
  Transfer& t = transfer(runs);
  move_pieces(runs, t, range, false);
  if (!staged) {
    t.done = dev_->to_host_async(dst, t.memory.memory + runs.data_at, runs.data_bytes);
    return t.done;
  }
  dev_->to_host_async(staged.get(), t.memory.memory + runs.data_at, runs.data_bytes);
  dev_->after_copies([dst, from = staged.get(), n = runs.data_bytes] { std::memcpy(dst, from, n); });
  t.staged = staged.release();
  t.done = dev_->copies_done();
  return t.done;
}

template <class Device>
auto CoreBackend<Device>::copy_pages_from_host(const void* src, std::span<const PageId> pages, ByteRange range) -> Completion {
  choreo::kernels::require_distinct_pages(pages);
  Staged staged = stage(src, pages.size() * range.bytes, src);
  std::lock_guard lock(mutex_);
  PageRuns runs = page_runs(pages, range);
  if (runs.data_bytes == 0) return {};
  Transfer& t = transfer(runs);
  // On the copy stream, so done before the scatter starts.
  dev_->from_host_async(t.memory.memory + runs.data_at, staged ? staged.get() : src, runs.data_bytes);
  t.staged = staged.release();
  move_pieces(runs, t, range, true);
  t.done = dev_->copies_done();
  return t.done;
}

template <class Device>
auto CoreBackend<Device>::page_runs(std::span<const PageId> pages, ByteRange range) -> PageRuns {
  PageRuns r;
  for (size_t i = 0; i < pages.size(); ++i) {
    page_bytes(pages[i], range);  // checks the page and the range
    Arena* a = &arena_of(pages[i]);
    if (r.runs.empty() || r.runs.back().arena != a) r.runs.push_back({a, i, 0});
    ++r.runs.back().count;
    r.index.push_back(int32_t(pages[i] & kIndexMask));
  }
  r.range_bytes = range.bytes;
  r.data_at = (r.index.size() * sizeof(int32_t) + 15) / 16 * 16;
  r.data_bytes = pages.size() * range.bytes;
  return r;
}

template <class Device>
auto CoreBackend<Device>::stage(const void* host, size_t bytes, const void* fill_from) -> Staged {
  if (bytes == 0 || pinned_.owns(host, bytes)) return Staged(nullptr, PoolRelease{&pinned_});
  Staged staged(static_cast<std::byte*>(pinned_.alloc(bytes)), PoolRelease{&pinned_});
  if (fill_from) std::memcpy(staged.get(), fill_from, bytes);
  return staged;
}

template <class Device>
auto CoreBackend<Device>::transfer(const PageRuns& runs) -> Transfer& {
  for (Transfer& t : transfers_)
    if (t.staged && t.done.ready()) pinned_.release(std::exchange(t.staged, nullptr));
  const size_t bytes = runs.data_at + runs.data_bytes;
  auto idle = std::find_if(transfers_.begin(), transfers_.end(),
                           [&](const Transfer& t) { return t.done.ready() && t.memory.bytes >= bytes; });
  if (idle == transfers_.end())
    idle = std::find_if(transfers_.begin(), transfers_.end(), [](const Transfer& t) { return t.done.ready(); });
  Transfer& t = idle != transfers_.end() ? *idle : transfers_.emplace_back();
  reserve(t.memory, bytes);
  t.n_index = runs.index.size();
  if (t.pinned_capacity < t.n_index) {
    if (t.pinned_index) dev_->release_host(std::exchange(t.pinned_index, nullptr));
    t.pinned_capacity = 0;
    const size_t capacity = std::max<size_t>(t.n_index, 64);
    t.pinned_index = static_cast<int32_t*>(dev_->alloc_host(capacity * sizeof(int32_t)));
    t.pinned_capacity = capacity;
  }
  std::copy(runs.index.begin(), runs.index.end(), t.pinned_index);
  dev_->from_host_async(t.memory.memory, t.pinned_index, t.n_index * sizeof(int32_t));
  return t;
}

template <class Device>
void CoreBackend<Device>::move_pieces(const PageRuns& runs, const Transfer& t, ByteRange range, bool to_pages) {
  for (const PageRun& r : runs.runs) {
    const auto launch = [&](auto word, const kernels::PagePieces& p) {
      using Word = decltype(word);
      const cu::Ptr<Word> pool = arena_words<Word>(*r.arena), buffer = t.template pieces<Word>(r, runs);
      const char* name = to_pages ? "scatter_pages" : "gather_pages";
      auto* kernel = to_pages ? &kernels::scatter_pages<Word> : &kernels::gather_pages<Word>;
      cu::launch(name, kernel, kernels::page_pieces_grid(p), Dim3(kernels::kPagePiecesThreads), 0,
                 dev_->copy_stream(), cu::Ptr<const Word>(to_pages ? buffer : pool), t.indices(r), p,
                 to_pages ? pool : buffer);
      dev_->launched(name);
    };
    kernels::in_page_words(r.arena->page_floats * sizeof(float), range.offset, range.bytes, int(r.count), launch);
  }
}

}  // namespace choreo::cuda
