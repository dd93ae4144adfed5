#pragma once
// The CUDA backend's host logic, written once and compiled twice (issue 14):
// - by the host compiler with the emulated device (kernels/cuda/emu/emulated_backend.cc), where every launch
//   runs in the block emulator and every array an operation touches is checked against the allocations;
// - by nvcc with the CUDA runtime (kernels/cuda/device/cuda_backend.cu), where launches are <<<>>> on a stream.
// Everything but the memory and copy layer (`Device`) is this file: weights copied to device memory at load,
// KV page arenas (one allocation per page size, indexed by page number: tier 0), the flattening of attention
// groups and per-call metadata staged into device memory, launch geometry, scratch for split-K partials. So
// all of it runs, checked, on a machine without a GPU; only the Device layer below is left for a GPU to test.
//
// The Device layer (a class; see EmulatedDevice and CudaDevice):
//   std::string name() const;
//   std::string label() const;                      // the device, in errors ("CUDA device 0")
//   void* alloc(size_t bytes);                      // device memory, 64-byte aligned; null when there is no room
//   void release(void* p);
//   std::optional<kernels::Backend::DeviceMemory> memory() const;  // free and total; nullopt: no limit known
//   void* alloc_host(size_t bytes);                 // pinned host memory for tier copies; throws on failure
//   void release_host(void* p);
//   void upload(void* dst, const void* host, size_t bytes);      // done when it returns
//   void upload_staged(void* dst, const void* host, size_t bytes);  // ordered on stream(); `host` (pageable)
//                                                   // may be reused on return, the device copy may be pending
//   void download(void* host, const void* src, size_t bytes);    // done when it returns
//   void copy(void* dst, const void* src, size_t bytes);         // device to device, ordered with launches
//   void zero(void* dst, size_t bytes);
//   template <class T> cu::Ptr<T> global(T* p, size_t n, const char* what) const;  // a caller's array
//   cu::Stream stream() const;                      // the stream every launch and copy above goes to
//   void launched(const char* kernel);              // after every launch: device errors are checked here
//   void gemm(const blas::Gemm& g);                 // a product of device arrays on the stream (blas.h)
//   void synchronize();                             // every launch and copy done (before memory is moved)
//   kernels::Completion to_host_async(void* host, const void* src, size_t bytes);    // tier copies
//   kernels::Completion from_host_async(void* dst, const void* host, size_t bytes);
//   cu::Stream copy_stream() const;                 // where the async copies above go (after the compute
//                                                   // work issued before each): gathers and scatters too
//   kernels::Completion copies_done();              // done when the copy stream's work issued so far is done
//   void after_copies(std::function<void()> f);     // f runs on the host once the copy stream's work issued so
//                                                   // far is done (f must not call the device)
// A device allocation that does not fit is the InputError of throw_no_device_memory, the same on both devices,
// naming the KV budget (set_kv_budget) beside the device's free memory.
// Operations are serialised by one mutex (the tiers' copy thread calls copy_to_host / copy_from_host while the
// engine computes); the Device's alloc/release take their own lock, since weights are released by their owners.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/backend_errors.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/attention_tiled.cuh"
#include "kernels/cuda/kernels/elementwise.cuh"
#include "kernels/cuda/kernels/linear.cuh"
#include "kernels/cuda/kernels/lora.cuh"
#include "kernels/cuda/kernels/pages.cuh"
#include "kernels/cuda/kernels/sampling.cuh"
#include "kernels/cuda/pinned_pool.h"
#include "kernels/cuda/portable.h"

namespace choreo::cuda {

/// Split size of attention's split-K: fixed, so a query's reduction order never depends on its batch.
inline constexpr int kAttentionSplitTokens = 256;

template <class Device>
class CoreBackend final : public choreo::kernels::Backend {
  using Weight = choreo::kernels::Weight;
  using DType = choreo::kernels::DType;
  using KvLayout = choreo::kernels::KvLayout;
  using PageId = choreo::kernels::PageId;
  using ByteRange = choreo::kernels::ByteRange;
  using Completion = choreo::kernels::Completion;
  using DeviceMemory = choreo::kernels::Backend::DeviceMemory;

 public:
  explicit CoreBackend(std::shared_ptr<Device> device)
      : dev_(std::move(device)),
        pinned_([dev = dev_](size_t bytes) { return dev->alloc_host(bytes); },
                [dev = dev_](void* p) { dev->release_host(p); }) {
    dummy_ = static_cast<float*>(device_alloc(64));
    dev_->zero(dummy_, 64);
  }
  ~CoreBackend() override {
    dev_->synchronize();
    for (Arena& a : arenas_) dev_->release(a.memory);
    for (Scratch* s : {&staging_, &part_m_, &part_l_, &part_acc_, &narrowed_})
      if (s->memory) dev_->release(s->memory);
    for (Transfer& t : transfers_) {
      dev_->release(t.memory.memory);
      if (t.pinned_index) dev_->release_host(t.pinned_index);
      if (t.staged) pinned_.release(t.staged);
    }
    dev_->release(dummy_);
  }

  std::string name() const override { return dev_->name(); }
  void set_threads(int n_threads) override {
    if (n_threads > choreo::kernels::kMaxThreads)
      throw_input_error(std::to_string(n_threads) + " threads requested; a backend takes at most " +
                        std::to_string(choreo::kernels::kMaxThreads));
    n_threads_ = std::max(1, n_threads);  // host threads do not matter: the device computes
  }
  int threads() const override { return n_threads_; }

  void* alloc(size_t bytes) override { return device_alloc(std::max<size_t>(bytes, 1)); }
  void release(void* p) override { dev_->release(p); }
  /// Pinned host memory from the pool (pinned_pool.h: a few large pinned allocations, not one per call).
  void* alloc_host(size_t bytes) override { return pinned_.alloc(bytes); }
  void release_host(void* p) override { pinned_.release(p); }
  std::optional<DeviceMemory> device_memory() const override { return dev_->memory(); }
  void set_kv_budget(size_t budget_bytes) override { kv_budget_ = budget_bytes; }
  bool prefers_device_sampling() const override { return true; }
  /// The device layer (for tests of the emulated device).
  const Device& device() const { return *dev_; }
  void upload(void* dst, const void* host, size_t bytes) override {
    std::lock_guard lock(mutex_);
    dev_->upload(checked(static_cast<std::byte*>(dst), bytes, "upload"), host, bytes);
  }
  void download(void* host, const void* src, size_t bytes) override {
    std::lock_guard lock(mutex_);
    dev_->download(host, checked(static_cast<const std::byte*>(src), bytes, "download"), bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    std::lock_guard lock(mutex_);
    dev_->copy(checked(static_cast<std::byte*>(dst), bytes, "copy"), checked(static_cast<const std::byte*>(src), bytes, "copy"),
               bytes);
  }

  /// Weights are copied to device memory once, as stored (the kernels read every format in place);
  /// Weight::packed owns the copy, Weight::data stays the host rows.
  Weight upload_weight(const Weight& w) override {
    weight_format(w.type);  // refuses a format the kernels cannot read, at load
    if (w.type == DType::F32 && w.row_stride % sizeof(float) != 0)
      throw_input_error("an F32 weight whose rows are not 4-byte aligned cannot be read by the CUDA kernels");
    Weight uploaded = w;
    const size_t bytes = weight_bytes(w);
    void* memory = device_alloc(std::max<size_t>(bytes, 1));
    {
      std::lock_guard lock(mutex_);
      if (bytes > 0) dev_->upload(memory, w.data, bytes);
    }
    uploaded.packed = std::shared_ptr<const void>(memory, [dev = dev_](const void* p) { dev->release(const_cast<void*>(p)); });
    return uploaded;
  }
  Weight upload_table(const Weight& table) override { return upload_weight(table); }

  /// F32, F16 and BF16 weights: one GEMM in cuBLAS's conventions (kernels/cuda/blas.h: on a GPU cuBLASLt with
  /// a pinned algorithm, in emulation a CPU GEMM summing over k in order), the activations rounded to the
  /// weight's type first when it is F16 or BF16 (cuBLAS's operands share one type; llama.cpp's CUDA backend
  /// does the same). The quantised formats: the linear kernel, dequantising the blocks on the fly. Either way a
  /// row's bits do not depend on the other rows of the product.
  void matmul(const Weight& w, const float* x, int n, float* y) override {
    if (n <= 0 || w.n_out == 0) return;
    std::lock_guard lock(mutex_);
    if (const std::optional<blas::Type> t = gemm_type(w)) return gemm_product(w, *t, x, n, y);
    const WeightView v = view(w);
    cu::launch("linear", kernels::linear, Dim3(kernels::linear_output_blocks(int(w.n_out)), kernels::linear_row_groups(n)),
               Dim3(32 * kernels::kLinearWarps), 0, dev_->stream(), v.args, v.f32, v.bytes,
               arg(x, size_t(n) * size_t(w.n_in)), n, arg(y, size_t(n) * size_t(w.n_out)));
    dev_->launched("linear");
  }
  void matmul_group(std::span<const choreo::kernels::MatmulOutput> outputs, const float* x, int n) override {
    for (const choreo::kernels::MatmulOutput& o : outputs) matmul(*o.w, x, n, o.y);
  }
  void embed(const Weight& table, std::span<const int32_t> ids, float* out) override {
    if (ids.empty()) return;
    for (int32_t id : ids)
      if (id < 0 || id >= table.n_out)
        throw_input_error("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(table.n_out));
    std::lock_guard lock(mutex_);
    const WeightView v = view(table);
    Staging st(*this);
    const size_t at_ids = st.add(ids);
    st.commit();
    cu::launch("embed_rows", kernels::embed_rows, Dim3(unsigned(ids.size())), Dim3(128), 0, dev_->stream(), v.args, v.f32,
               v.bytes, st.template get<int32_t>(at_ids, ids.size()), arg(out, ids.size() * size_t(table.n_in)));
    dev_->launched("embed_rows");
  }
  void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) override {
    if (n <= 0) return;
    std::lock_guard lock(mutex_);
    const size_t size = size_t(n) * size_t(dim);
    cu::launch("rmsnorm", kernels::rmsnorm, Dim3(unsigned(n)), Dim3(256), 0, dev_->stream(), arg(x, size),
               arg(weight, size_t(dim)), dim, eps, arg(out, size));
    dev_->launched("rmsnorm");
  }
  void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const choreo::kernels::RopeParams& p) override {
    if (n <= 0) return;
    std::lock_guard lock(mutex_);
    Staging st(*this);
    const size_t at_pos = st.add(std::span<const int32_t>(pos, size_t(n)));
    const std::optional<size_t> at_factors = stage_factors(st, p);
    st.commit();
    cu::launch("rope", kernels::rope, Dim3(unsigned(n)), Dim3(128), 0, dev_->stream(),
               arg(x, size_t(n) * size_t(n_heads) * size_t(head_dim)), n_heads, head_dim,
               st.template get<int32_t>(at_pos, size_t(n)), 0, 1, rope_args(p), factors(st, p, at_factors));
    dev_->launched("rope");
  }
  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    cu::launch("swiglu", kernels::swiglu, Dim3(kernels::grid_stride_blocks(n)), Dim3(256), 0, dev_->stream(), arg(gate, n),
               arg(up, n), n, arg(out, n));
    dev_->launched("swiglu");
  }
  void add(float* x, const float* y, size_t n) override {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    cu::launch("add", kernels::add, Dim3(kernels::grid_stride_blocks(n)), Dim3(256), 0, dev_->stream(), arg(x, n), arg(y, n), n);
    dev_->launched("add");
  }
  void scale(float* x, size_t n, float s) override {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    cu::launch("scale", kernels::scale, Dim3(kernels::grid_stride_blocks(n)), Dim3(256), 0, dev_->stream(), arg(x, n), n, s);
    dev_->launched("scale");
  }

  bool supports_kv(const KvLayout& kv) const override { return kv_type(kv.k_type) && kv_type(kv.v_type); }
  PageId alloc_page(size_t bytes) override {
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
  void free_page(PageId page) override {
    std::lock_guard lock(mutex_);
    arena_of(page).free.push_back(page & kIndexMask);
  }
  void store_kv(const KvLayout& kv, int layer, std::span<const PageId> pages, std::span<const int32_t> slots,
                const float* k, const float* v) override {
    if (pages.empty()) return;
    require_types(kv);
    std::lock_guard lock(mutex_);
    Arena& a = arena_for(kv, pages[0]);
    std::vector<int32_t> index(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) index[i] = int32_t(page_in(a, pages[i]));
    const size_t n = pages.size(), rows = n * size_t(kv.kv_dim());
    Staging st(*this);
    const size_t at_index = st.add(std::span<const int32_t>(index)), at_slots = st.add(slots.first(n));
    st.commit();
    cu::launch("store_kv", kernels::store_kv, Dim3(unsigned(n)), Dim3(128), 0, dev_->stream(), pool(a), cache_args(kv, layer),
               st.template get<int32_t>(at_index, n), st.template get<int32_t>(at_slots, n), arg(k, rows), arg(v, rows));
    dev_->launched("store_kv");
  }
  void copy_page(PageId dst, PageId src, ByteRange range) override {
    std::lock_guard lock(mutex_);
    std::byte* to = page_bytes(dst, range);
    dev_->copy(to, page_bytes(src, range), range.bytes);
  }
  Completion copy_to_host(PageId src, ByteRange range, void* dst) override {
    std::lock_guard lock(mutex_);
    return dev_->to_host_async(dst, page_bytes(src, range), range.bytes);
  }
  Completion copy_from_host(const void* src, PageId dst, ByteRange range) override {
    std::lock_guard lock(mutex_);
    return dev_->from_host_async(page_bytes(dst, range), src, range.bytes);
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
  Completion copy_pages_to_host(std::span<const PageId> pages, ByteRange range, void* dst) override {
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
  Completion copy_pages_from_host(const void* src, std::span<const PageId> pages, ByteRange range) override {
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

  // ---- Sampling helpers (kernels/cuda/kernels/sampling.cuh): one block per row ----
  void top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values) override {
    choreo::kernels::check_top_k(n_rows, n_vocab, k);
    if (n_rows == 0) return;
    std::lock_guard lock(mutex_);
    const size_t picks = size_t(n_rows) * size_t(k);
    cu::launch("top_k", kernels::top_k, Dim3(kernels::sampling_blocks(n_rows)), Dim3(kernels::kSamplingThreads), 0,
               dev_->stream(), arg(logits, size_t(n_rows) * size_t(n_vocab)), n_rows, n_vocab, k, arg(ids, picks),
               arg(values, picks));
    dev_->launched("top_k");
  }
  void softmax(const float* x, int n_rows, int n, float temperature, float* out) override {
    choreo::kernels::check_softmax(n_rows, n, temperature);
    if (n_rows == 0) return;
    std::lock_guard lock(mutex_);
    const size_t size = size_t(n_rows) * size_t(n);
    cu::launch("softmax", kernels::softmax, Dim3(kernels::sampling_blocks(n_rows)), Dim3(kernels::kSamplingThreads), 0,
               dev_->stream(), arg(x, size), n_rows, n, temperature, arg(out, size));
    dev_->launched("softmax");
  }

  // ---- LoRA (kernels/cuda/kernels/lora.cuh): one block per row ----
  /// F32, F16 and BF16 pairs of rank up to kLoraMaxRank: the lora kernel, with f32 activations (the default
  /// path would round them to F16/BF16 for cuBLAS) and without scratch. Quantised adapters and larger ranks:
  /// the default two products (Backend::add_lora), whose rows are batch invariant too.
  void add_lora(const Weight& a, const Weight& b, float factor, const float* x, int n, float* y,
                float* scratch) override {
    choreo::kernels::check_lora(a, b, n);
    if (n == 0 || b.n_out == 0) return;
    if (!kernels::lora_reads(weight_format(a.type)) || !kernels::lora_reads(weight_format(b.type)) ||
        a.n_out > kernels::kLoraMaxRank)
      return Backend::add_lora(a, b, factor, x, n, y, scratch);
    std::lock_guard lock(mutex_);
    const WeightView va = view(a), vb = view(b);
    cu::launch("lora", kernels::lora, Dim3(kernels::lora_blocks(n)), Dim3(kernels::kLoraThreads), 0, dev_->stream(),
               kernels::LoraWeight{va.args, va.f32, va.bytes}, kernels::LoraWeight{vb.args, vb.f32, vb.bytes}, factor,
               arg(x, size_t(n) * size_t(a.n_in)), n, arg(y, size_t(n) * size_t(b.n_out)));
    dev_->launched("lora");
  }

  void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
                 std::span<const choreo::kernels::AttentionGroup> groups, const choreo::kernels::RopeParams& rope,
                 float scale, float* out) override {
    if (n_q <= 0) return;
    require_types(kv);
    if (kv.head_dim > kernels::kMaxHeadDim)
      throw_input_error("head dimension " + std::to_string(kv.head_dim) + " is above the CUDA attention kernel's " +
                        std::to_string(kernels::kMaxHeadDim));
    std::lock_guard lock(mutex_);
    // The groups flattened for the kernels (kernel_args.h): page numbers within one arena, segments, groups.
    Arena* arena = nullptr;
    std::vector<int32_t> page_list, group_of_query(size_t(n_q), -1);
    std::vector<kernels::AttnSegment> segments;
    std::vector<kernels::AttnGroup> kgroups;
    int max_keys = 0;
    for (const choreo::kernels::AttentionGroup& g : groups) {
      if (g.q_begin < 0 || g.q_end > n_q || g.q_begin > g.q_end) throw std::logic_error("attention: a group's rows are outside the batch");
      kgroups.push_back({g.q_begin, g.q_end, int(segments.size()), int(g.segments.size())});
      int keys = 0;
      for (const choreo::kernels::KvSegment& s : g.segments) {
        if (kv.pages_for(size_t(s.n_tokens)) > s.pages.size())
          throw std::logic_error("attention: a segment has fewer pages than its tokens need");
        segments.push_back({int(page_list.size()), s.n_tokens, s.delta, s.causal_base});
        for (PageId p : s.pages) {
          if (!arena) arena = &arena_for(kv, p);
          page_list.push_back(int32_t(page_in(*arena, p)));
        }
        keys += s.n_tokens;
      }
      max_keys = std::max(max_keys, keys);
      for (int j = g.q_begin; j < g.q_end; ++j) group_of_query[size_t(j)] = int32_t(kgroups.size() - 1);
    }
    if (std::count(group_of_query.begin(), group_of_query.end(), -1) > 0)
      throw std::logic_error("attention: a query row belongs to no group");
    const int n_splits = std::max(1, (max_keys + kAttentionSplitTokens - 1) / kAttentionSplitTokens);
    const size_t parts = size_t(n_q) * size_t(n_heads) * size_t(n_splits), width = size_t(n_heads) * size_t(kv.head_dim);
    reserve(part_m_, parts * sizeof(float));
    reserve(part_l_, parts * sizeof(float));
    reserve(part_acc_, parts * size_t(kv.head_dim) * sizeof(float));
    if (page_list.empty()) page_list.push_back(0);  // a kernel argument must point somewhere
    if (segments.empty()) segments.push_back({});
    Staging st(*this);
    const size_t at_pages = st.add(std::span<const int32_t>(page_list)),
                 at_segments = st.add(std::span<const kernels::AttnSegment>(segments)),
                 at_groups = st.add(std::span<const kernels::AttnGroup>(kgroups)),
                 at_group_of = st.add(std::span<const int32_t>(group_of_query));
    // Prefill (a group of several rows) takes the tiled kernel: key and value tiles shared by the rows of a
    // block, each row's partials attention_partials' to the bit (attention_tiled.cuh), so choosing it changes
    // no result. Above 48 KiB of shared memory (head_dim > 168) a device launch would need an opt-in: not taken.
    const bool tiled = kernels::tiled_shared_bytes(kv.head_dim) <= 48 * 1024 &&
                       std::any_of(kgroups.begin(), kgroups.end(), [](const kernels::AttnGroup& g) { return g.q_end - g.q_begin > 1; });
    const std::vector<kernels::AttnTiledBlock> blocks =
        tiled ? kernels::tiled_blocks(kgroups.data(), int(kgroups.size())) : std::vector<kernels::AttnTiledBlock>();
    const size_t at_blocks = st.add(std::span<const kernels::AttnTiledBlock>(blocks));
    const std::optional<size_t> at_factors = stage_factors(st, rope);
    st.commit();
    const kernels::AttnCache cache = cache_args(kv, layer);
    const cu::Ptr<float> m = floats(part_m_, parts), l = floats(part_l_, parts),
                         acc = floats(part_acc_, parts * size_t(kv.head_dim));
    const cu::Ptr<float> kv_pool = arena ? pool(*arena) : cu::make_ptr(static_cast<float*>(dummy_), 16);
    if (tiled) {
      cu::launch("attention_partials_tiled", kernels::attention_partials_tiled,
                 Dim3(unsigned(blocks.size()), unsigned(n_heads), unsigned(n_splits)), Dim3(kernels::kTiledThreads),
                 kernels::tiled_shared_bytes(kv.head_dim), dev_->stream(), arg(q, size_t(n_q) * width), n_heads, kv_pool,
                 cache, st.template get<int32_t>(at_pages, page_list.size()),
                 st.template get<kernels::AttnSegment>(at_segments, segments.size()),
                 st.template get<kernels::AttnGroup>(at_groups, kgroups.size()),
                 st.template get<kernels::AttnTiledBlock>(at_blocks, blocks.size()), rope_args(rope),
                 factors(st, rope, at_factors), scale, kAttentionSplitTokens, n_splits, m, l, acc);
      dev_->launched("attention_partials_tiled");
    } else {
      cu::launch("attention_partials", kernels::attention_partials, Dim3(unsigned(n_q), unsigned(n_heads), unsigned(n_splits)),
                 Dim3(32), 0, dev_->stream(), arg(q, size_t(n_q) * width), n_heads, kv_pool, cache,
                 st.template get<int32_t>(at_pages, page_list.size()),
                 st.template get<kernels::AttnSegment>(at_segments, segments.size()),
                 st.template get<kernels::AttnGroup>(at_groups, kgroups.size()),
                 st.template get<int32_t>(at_group_of, group_of_query.size()), rope_args(rope),
                 factors(st, rope, at_factors), scale, kAttentionSplitTokens, n_splits, m, l, acc);
      dev_->launched("attention_partials");
    }
    cu::launch("attention_combine", kernels::attention_combine, Dim3(unsigned(n_q), unsigned(n_heads)), Dim3(32), 0,
               dev_->stream(), n_heads, kv.head_dim, n_splits, cu::Ptr<const float>(m), cu::Ptr<const float>(l),
               cu::Ptr<const float>(acc), arg(out, size_t(n_q) * width));
    dev_->launched("attention_combine");
  }

 private:
  /// Pages of one size, page after page in one device allocation; a PageId is (arena << 24 | page).
  struct Arena {
    size_t page_bytes = 0, page_floats = 0;
    float* memory = nullptr;
    uint32_t capacity = 0, n_pages = 0;
    std::vector<uint32_t> free;
  };
  /// Device memory the backend keeps between calls (staged metadata, split-K partials), grown on demand.
  struct Scratch {
    std::byte* memory = nullptr;
    size_t bytes = 0;
  };
  static constexpr int kIndexBits = 24;
  static constexpr uint32_t kIndexMask = (uint32_t(1) << kIndexBits) - 1, kPagesPerArena = kIndexMask + 1;
  static constexpr size_t kMaxArenas = 256;

  /// Per-call metadata (ids, positions, page lists, segments, RoPE factors) gathered in host memory, then
  /// copied to device memory in one upload; arrays are 16-byte aligned.
  class Staging {
   public:
    explicit Staging(CoreBackend& be) : be_(be) {}
    template <class T>
    size_t add(std::span<const T> values) {
      const size_t at = (host_.size() + 15) / 16 * 16;
      host_.resize(at + std::max<size_t>(values.size_bytes(), 1));
      if (!values.empty()) std::memcpy(host_.data() + at, values.data(), values.size_bytes());
      return at;
    }
    void commit() {
      be_.reserve(be_.staging_, host_.size());
      // Not waited for: the launches that read it follow on the same stream, and so does the next operation's
      // upload into the same memory.
      be_.dev_->upload_staged(be_.staging_.memory, host_.data(), host_.size());
    }
    template <class T>
    cu::Ptr<const T> get(size_t at, size_t n) const {
      return cu::make_ptr(reinterpret_cast<const T*>(be_.staging_.memory + at), n);
    }

   private:
    CoreBackend& be_;
    std::vector<std::byte> host_;
  };

  /// The GEMM operand type of a weight cuBLAS takes as stored (rows a whole number of elements apart).
  static std::optional<blas::Type> gemm_type(const Weight& w) {
    const std::optional<blas::Type> t = w.type == DType::F32    ? std::optional(blas::Type::F32)
                                        : w.type == DType::F16  ? std::optional(blas::Type::F16)
                                        : w.type == DType::BF16 ? std::optional(blas::Type::BF16)
                                                                : std::nullopt;
    if (!t || w.row_stride % size_t(blas::type_bytes(*t)) != 0) return std::nullopt;
    return t;
  }
  void gemm_product(const Weight& w, blas::Type t, const float* x, int n, float* y) {
    if (!w.packed) throw std::logic_error("a weight the CUDA backend has not uploaded (Backend::upload_weight)");
    const size_t inputs = size_t(n) * size_t(w.n_in), bytes = size_t(blas::type_bytes(t));
    checked(x, inputs, "matmul input");  // counts of elements
    checked(y, size_t(n) * size_t(w.n_out), "matmul output");
    checked(static_cast<const std::byte*>(w.packed.get()), weight_bytes(w), "weight");
    const void* operand = x;
    if (t != blas::Type::F32) {
      reserve(narrowed_, inputs * bytes);
      const cu::Ptr<uint16_t> out = cu::make_ptr(reinterpret_cast<uint16_t*>(narrowed_.memory), inputs);
      cu::launch("narrow", kernels::narrow, Dim3(kernels::grid_stride_blocks(inputs)), Dim3(256), 0, dev_->stream(),
                 arg(x, inputs), inputs, t == blas::Type::BF16 ? 1 : 0, out);
      dev_->launched("narrow");
      operand = narrowed_.memory;
    }
    dev_->gemm(blas::linear(w.packed.get(), int(w.n_out), int(w.n_in), operand, n, y, false, t,
                            int(w.row_stride / bytes)));
    dev_->launched("gemm");
  }

  static kernels::WeightFormat weight_format(DType t) {
    switch (t) {
      case DType::F32: return kernels::WeightFormat::F32;
      case DType::F16: return kernels::WeightFormat::F16;
      case DType::BF16: return kernels::WeightFormat::BF16;
      case DType::Q8_0: return kernels::WeightFormat::Q8_0;
      case DType::Q4_0: return kernels::WeightFormat::Q4_0;
      case DType::Q4_1: return kernels::WeightFormat::Q4_1;
      default:
        throw_input_error("the CUDA backend has no kernels for " + std::string(choreo::kernels::type_traits(t).name) +
                              " weights",
                          "use a model in F32, F16, BF16, Q8_0, Q4_0 or Q4_1");
    }
  }
  static size_t weight_bytes(const Weight& w) {
    return w.n_out == 0 ? 0 : size_t(w.n_out - 1) * w.row_stride + choreo::kernels::row_bytes(w.type, w.n_in);
  }
  /// The kernels' view of an uploaded weight: its arguments and its device rows.
  struct WeightView {
    kernels::WeightArgs args;
    cu::Ptr<const float> f32;
    cu::Ptr<const uint8_t> bytes;
  };
  WeightView view(const Weight& w) const {
    if (!w.packed) throw std::logic_error("a weight the CUDA backend has not uploaded (Backend::upload_weight)");
    WeightView v;
    v.args = {weight_format(w.type), int(w.n_out), int(w.n_in), w.row_stride};
    const size_t extent = weight_bytes(w);
    if (w.type == DType::F32)
      v.f32 = dev_->global(static_cast<const float*>(w.packed.get()), extent / sizeof(float), "weight");
    else
      v.bytes = dev_->global(static_cast<const uint8_t*>(w.packed.get()), extent, "weight");
    return v;
  }

  static std::optional<kernels::KvType> kv_type(DType t) {
    if (t == DType::F32) return kernels::KvType::F32;
    if (t == DType::F16) return kernels::KvType::F16;
    if (t == DType::Q8_0) return kernels::KvType::Q8_0;
    return std::nullopt;
  }
  static void require_types(const KvLayout& kv) {
    if (!kv_type(kv.k_type) || !kv_type(kv.v_type))
      throw_input_error("the CUDA kernels store KV pages in f32, f16 or q8_0 only",
                        "use --cache-type-k / --cache-type-v f32, f16 or q8_0");
  }
  static kernels::AttnCache cache_args(const KvLayout& kv, int layer) {
    return {kv.n_layers, kv.n_kv_heads, kv.head_dim, kv.page_tokens, layer, *kv_type(kv.k_type), *kv_type(kv.v_type)};
  }
  static kernels::RopeArgs rope_args(const choreo::kernels::RopeParams& p) {
    return {p.n_dims, p.freq_base, p.layout == choreo::kernels::RopeParams::Layout::Interleaved ? 1 : 0, p.freq_factors ? 1 : 0};
  }
  static std::optional<size_t> stage_factors(Staging& st, const choreo::kernels::RopeParams& p) {
    if (!p.freq_factors) return std::nullopt;
    return st.add(std::span<const float>(p.freq_factors, size_t(p.n_dims / 2)));
  }
  static cu::Ptr<const float> factors(const Staging& st, const choreo::kernels::RopeParams& p, std::optional<size_t> at) {
    return at ? st.template get<float>(*at, size_t(p.n_dims / 2)) : cu::Ptr<const float>();
  }

  /// A caller's array of n elements, which must be this backend's memory.
  template <class T>
  cu::Ptr<T> arg(T* p, size_t n) const {
    return dev_->global(p, n, "kernel argument");
  }
  /// p, once the device has checked that its n elements are its memory.
  template <class T>
  T* checked(T* p, size_t n, const char* what) const {
    if (n > 0) dev_->global(p, n, what);
    return p;
  }
  /// At least `bytes` bytes of scratch; the contents are not kept.
  void reserve(Scratch& s, size_t bytes) {
    if (s.bytes >= bytes) return;
    const size_t grown = std::max({bytes, 2 * s.bytes, size_t(4096)});
    dev_->synchronize();  // launches may still read the old memory
    if (s.memory) dev_->release(s.memory);
    s.memory = nullptr;
    s.bytes = 0;
    s.memory = static_cast<std::byte*>(device_alloc(grown));
    s.bytes = grown;
  }
  static cu::Ptr<float> floats(const Scratch& s, size_t n) {
    return cu::make_ptr(reinterpret_cast<float*>(s.memory), n);
  }

  /// Device memory, or the out-of-memory InputError naming the KV budget.
  void* device_alloc(size_t bytes) {
    if (void* p = dev_->alloc(bytes)) return p;
    const std::optional<DeviceMemory> m = dev_->memory();
    throw_no_device_memory(dev_->label(), bytes, m ? m->free_bytes : 0, m ? m->total_bytes : 0, kv_budget_);
  }
  /// Room for more pages: a new allocation twice the size (no more pages than the KV budget holds, while it
  /// holds more than there are), the pages copied, the old one released.
  void grow(Arena& a) {
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
  static cu::Ptr<float> pool(const Arena& a) { return cu::make_ptr(a.memory, size_t(a.n_pages) * a.page_floats); }
  Arena& arena_of(PageId page) {
    const size_t arena = page >> kIndexBits;
    if (arena >= arenas_.size() || (page & kIndexMask) >= arenas_[arena].n_pages)
      throw std::out_of_range("page " + std::to_string(page) + " was not allocated by this backend");
    return arenas_[arena];
  }
  /// The arena of a KV page of this layout (all pages a kernel reads must share one, as they share a size).
  Arena& arena_for(const KvLayout& kv, PageId page) {
    Arena& a = arena_of(page);
    if (a.page_bytes != kv.page_bytes())
      throw std::logic_error("page " + std::to_string(page) + " holds " + std::to_string(a.page_bytes) +
                             " bytes, the KV layout's pages " + std::to_string(kv.page_bytes()));
    return a;
  }
  uint32_t page_in(Arena& a, PageId page) {
    if (&arena_of(page) != &a) throw std::logic_error("attention: pages of different sizes in one call");
    return page & kIndexMask;
  }
  std::byte* page_bytes(PageId page, ByteRange range) {
    Arena& a = arena_of(page);
    if (range.offset > a.page_bytes || range.bytes > a.page_bytes - range.offset)
      throw std::out_of_range("bytes [" + std::to_string(range.offset) + ", " + std::to_string(range.offset + range.bytes) +
                              ") are outside page " + std::to_string(page) + " of " + std::to_string(a.page_bytes) + " bytes");
    return reinterpret_cast<std::byte*>(a.memory + size_t(page & kIndexMask) * a.page_floats) + range.offset;
  }

  // ---- Batched tier copies ----
  /// Consecutive pages of a list that lie in one arena: list entries [first, first + count).
  struct PageRun {
    Arena* arena = nullptr;
    size_t first = 0, count = 0;
  };
  /// A list of pages checked and split into runs, with their page numbers; in a transfer buffer the numbers
  /// come first, the pieces (data_bytes) at data_at (16-byte aligned, for 16-byte words).
  struct PageRuns {
    std::vector<PageRun> runs;
    std::vector<int32_t> index;
    size_t range_bytes = 0, data_at = 0, data_bytes = 0;
  };
  PageRuns page_runs(std::span<const PageId> pages, ByteRange range) {
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
  /// A staging range of the pinned pool, returned to it unless handed to a Transfer.
  struct PoolRelease {
    PinnedPool* pool;
    void operator()(void* p) const { pool->release(p); }
  };
  using Staged = std::unique_ptr<std::byte, PoolRelease>;
  /// A pinned staging range for `bytes` of the caller's host memory at `host`, or null when that memory is the
  /// pool's already (pinned) or there is nothing to copy; `fill_from`, when not null, is copied into it.
  Staged stage(const void* host, size_t bytes, const void* fill_from) {
    if (bytes == 0 || pinned_.owns(host, bytes)) return Staged(nullptr, PoolRelease{&pinned_});
    Staged staged(static_cast<std::byte*>(pinned_.alloc(bytes)), PoolRelease{&pinned_});
    if (fill_from) std::memcpy(staged.get(), fill_from, bytes);
    return staged;
  }
  /// Device memory of one batched copy, and the pinned host memory its page numbers are uploaded from: reused
  /// once its copy is done (the copy stream may read or write both until then).
  struct Transfer {
    Scratch memory;
    int32_t* pinned_index = nullptr;  // page numbers, in pinned host memory (alloc_host)
    size_t pinned_capacity = 0;       // elements
    std::byte* staged = nullptr;      // the pinned pool's staging range for the caller's pageable memory, or null
    size_t n_index = 0;               // page numbers of the current copy
    Completion done;
    cu::Ptr<const int32_t> indices(const PageRun& r) const {
      return cu::make_ptr(reinterpret_cast<const int32_t*>(memory.memory), n_index) + ptrdiff_t(r.first);
    }
    template <class Word>
    cu::Ptr<Word> pieces(const PageRun& r, const PageRuns& runs) const {
      const size_t n = runs.data_bytes / sizeof(Word);
      return cu::make_ptr(reinterpret_cast<Word*>(memory.memory + runs.data_at), n) +
             ptrdiff_t(r.first * runs.range_bytes / sizeof(Word));
    }
  };
  /// A transfer buffer whose last copy is done, grown to hold these runs; their page numbers are copied to its
  /// pinned memory and on their way to its device memory on the copy stream.
  Transfer& transfer(const PageRuns& runs) {
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
  /// Launches, on the copy stream, gather_pages (from the arenas into the transfer buffer) or scatter_pages
  /// (back) over each run, in the widest word its arena's page stride and the range allow.
  void move_pieces(const PageRuns& runs, const Transfer& t, ByteRange range, bool to_pages) {
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
  /// An arena's pages as words (a page's stride is a whole number of them: in_page_words).
  template <class Word>
  static cu::Ptr<Word> arena_words(const Arena& a) {
    const size_t n = size_t(a.n_pages) * a.page_floats * sizeof(float) / sizeof(Word);
    return cu::make_ptr(reinterpret_cast<Word*>(a.memory), n);
  }
  std::vector<Transfer> transfers_;

  std::shared_ptr<Device> dev_;
  PinnedPool pinned_;  // alloc_host: after dev_, whose alloc_host it draws on
  std::mutex mutex_;
  int n_threads_ = 1;
  std::vector<Arena> arenas_;
  Scratch staging_, part_m_, part_l_, part_acc_;
  Scratch narrowed_;  // f16 / bf16 activations of a product by F16 / BF16 weights
  float* dummy_ = nullptr;  // the KV pool argument of a launch with no pages
  std::atomic<size_t> kv_budget_ = 0;  // set_kv_budget's; 0: none set
};

}  // namespace choreo::cuda
