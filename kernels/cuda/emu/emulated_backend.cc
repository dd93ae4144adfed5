// The CUDA backend's kernels as a kernels::Backend on the CPU (issue 14): every operation launches the kernel
// source of kernels/cuda/kernels/*.cuh through the block emulator, so a whole model, the engine and the
// conformance tests run on choreo's CUDA kernels with no GPU; every launch is checked for out-of-bounds accesses,
// shared-memory races and divergent barriers.
//
// What the emulated "device" is: the backend's memory (alloc) is host memory that it keeps a record of, and
// every float array an operation reads or writes must lie in it: a host pointer handed to an operation is an
// error, as it would be on a GPU (so the model code's use of Backend memory is checked here). KV pages live in
// arenas, one per page size, each a single allocation that the attention and store kernels index by page
// number (a CUDA backend's tier-0 pool is one device allocation too). Weights are read where upload_weight
// found them (the mapped file). Copies are done when they return.
//
// KV pages in f32, f16 and q8_0 (llama.cpp's -ctk/-ctv) are written and read by the kernels.
//
// Operations are serialised by one mutex: the emulator runs one block at a time on the calling thread, and an
// arena may move when it grows.

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_args.h"
#include "kernels/cuda/kernels/attention.cuh"
#include "kernels/cuda/kernels/elementwise.cuh"
#include "kernels/cuda/kernels/linear.cuh"
#include "kernels/cuda/portable.h"

namespace choreo::kernels {

namespace {

namespace ck = cuda::kernels;
using cuda::Dim3;
using cuda::cu::make_ptr;

/// Split size of attention's split-K: fixed, so a query's reduction order never depends on its batch.
constexpr int kSplitTokens = 256;

ck::WeightFormat weight_format(DType t) {
  switch (t) {
    case DType::F32: return ck::WeightFormat::F32;
    case DType::F16: return ck::WeightFormat::F16;
    case DType::BF16: return ck::WeightFormat::BF16;
    case DType::Q8_0: return ck::WeightFormat::Q8_0;
    case DType::Q4_0: return ck::WeightFormat::Q4_0;
    case DType::Q4_1: return ck::WeightFormat::Q4_1;
    default:
      throw InputError(fmt::format("the CUDA backend has no kernels for {} weights", type_traits(t).name),
                       "use a model in F32, F16, BF16, Q8_0, Q4_0 or Q4_1");
  }
}

/// The kernels' view of a weight: its arguments and its rows as checked memory.
struct WeightView {
  ck::WeightArgs args;
  cuda::cu::Ptr<const float> f32;
  cuda::cu::Ptr<const uint8_t> bytes;
};

WeightView view(const Weight& w) {
  WeightView v;
  v.args = {weight_format(w.type), int(w.n_out), int(w.n_in), w.row_stride};
  const size_t extent = w.n_out == 0 ? 0 : size_t(w.n_out - 1) * w.row_stride + row_bytes(w.type, w.n_in);
  if (w.type == DType::F32)
    v.f32 = make_ptr(static_cast<const float*>(w.data), extent / sizeof(float));
  else
    v.bytes = make_ptr(static_cast<const uint8_t*>(w.data), extent);
  return v;
}

class EmulatedCudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda-emulated"; }
  void set_threads(int n_threads) override {
    if (n_threads > kMaxThreads)
      throw InputError(fmt::format("{} threads requested; a backend takes at most {}", n_threads, kMaxThreads));
    n_threads_ = std::max(1, n_threads);  // the emulator runs every block on the calling thread
  }
  int threads() const override { return n_threads_; }

  void* alloc(size_t bytes) override {
    std::lock_guard lock(mutex_);
    void* p = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64));
    allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void release(void* p) override {
    std::lock_guard lock(mutex_);
    if (allocations_.erase(reinterpret_cast<uintptr_t>(p)) != 1)
      throw std::logic_error("release: memory this backend did not allocate");
    ::operator delete(p, std::align_val_t(64));
  }
  void upload(void* dst, const void* host, size_t bytes) override {
    std::lock_guard lock(mutex_);
    std::memcpy(on_device(dst, bytes, "upload"), host, bytes);
  }
  void download(void* host, const void* src, size_t bytes) override {
    std::lock_guard lock(mutex_);
    std::memcpy(host, on_device(src, bytes, "download"), bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    std::lock_guard lock(mutex_);
    std::memmove(on_device(dst, bytes, "copy"), on_device(src, bytes, "copy"), bytes);
  }

  Weight upload_weight(const Weight& w) override {
    weight_format(w.type);  // refuses a format the kernels cannot read, at load
    if (w.type == DType::F32 && w.row_stride % sizeof(float) != 0)
      throw InputError("an F32 weight whose rows are not 4-byte aligned cannot be read by the CUDA kernels");
    return w;
  }

  void matmul(const Weight& w, const float* x, int n, float* y) override {
    if (n <= 0 || w.n_out == 0) return;
    std::lock_guard lock(mutex_);
    const WeightView v = view(w);
    cuda::cu::launch("linear", ck::linear, Dim3(ck::linear_output_blocks(int(w.n_out)), ck::linear_row_groups(n)), Dim3(32 * ck::kLinearWarps), 0, nullptr,
                     v.args, v.f32, v.bytes, dev(x, size_t(n) * size_t(w.n_in)), n,
                     dev(y, size_t(n) * size_t(w.n_out)));
  }
  void matmul_group(std::span<const MatmulOutput> outputs, const float* x, int n) override {
    for (const MatmulOutput& o : outputs) matmul(*o.w, x, n, o.y);
  }
  void embed(const Weight& table, std::span<const int32_t> ids, float* out) override {
    if (ids.empty()) return;
    for (int32_t id : ids)
      if (id < 0 || id >= table.n_out) throw InputError(fmt::format("token id {} is outside the vocabulary of {}", id, table.n_out));
    std::lock_guard lock(mutex_);
    const WeightView v = view(table);
    cuda::cu::launch("embed_rows", ck::embed_rows, Dim3(unsigned(ids.size())), Dim3(128), 0, nullptr, v.args, v.f32,
                     v.bytes, make_ptr(ids.data(), ids.size()), dev(out, ids.size() * size_t(table.n_in)));
  }
  void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) override {
    if (n <= 0) return;
    std::lock_guard lock(mutex_);
    const size_t size = size_t(n) * size_t(dim);
    cuda::cu::launch("rmsnorm", ck::rmsnorm, Dim3(unsigned(n)), Dim3(256), 0, nullptr, dev(x, size), dev(weight, size_t(dim)), dim,
                     eps, dev(out, size));
  }
  void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const RopeParams& p) override {
    if (n <= 0) return;
    std::lock_guard lock(mutex_);
    cuda::cu::launch("rope", ck::rope, Dim3(unsigned(n)), Dim3(128), 0, nullptr,
                     dev(x, size_t(n) * size_t(n_heads) * size_t(head_dim)), n_heads, head_dim,
                     make_ptr(pos, size_t(n)), 0, 1, rope_args(p), factors(p));
  }
  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    cuda::cu::launch("swiglu", ck::swiglu, Dim3(ck::grid_stride_blocks(n)), Dim3(256), 0, nullptr, dev(gate, n), dev(up, n), n,
                     dev(out, n));
  }
  void add(float* x, const float* y, size_t n) override {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    cuda::cu::launch("add", ck::add, Dim3(ck::grid_stride_blocks(n)), Dim3(256), 0, nullptr, dev(x, n), dev(y, n), n);
  }
  void scale(float* x, size_t n, float s) override {
    if (n == 0) return;
    std::lock_guard lock(mutex_);
    cuda::cu::launch("scale", ck::scale, Dim3(ck::grid_stride_blocks(n)), Dim3(256), 0, nullptr, dev(x, n), n, s);
  }

  bool supports_kv(const KvLayout& kv) const override { return kv_type(kv.k_type) && kv_type(kv.v_type); }
  PageId alloc_page(size_t bytes) override {
    std::lock_guard lock(mutex_);
    auto it = std::find_if(arenas_.begin(), arenas_.end(), [&](const Arena& a) { return a.page_bytes == bytes; });
    if (it == arenas_.end()) {
      if (arenas_.size() == kMaxArenas) throw std::bad_alloc();
      arenas_.push_back({bytes, (bytes + sizeof(float) - 1) / sizeof(float), {}, {}, 0});
      it = arenas_.end() - 1;
    }
    Arena& a = *it;
    uint32_t index;
    if (!a.free.empty()) {
      index = a.free.back();
      a.free.pop_back();
      std::fill_n(a.memory.begin() + ptrdiff_t(size_t(index) * a.page_floats), a.page_floats, 0.0f);
    } else {
      if (a.n_pages == kPagesPerArena) throw std::bad_alloc();
      index = a.n_pages++;
      a.memory.resize(size_t(a.n_pages) * a.page_floats, 0.0f);
    }
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
    cuda::cu::launch("store_kv", ck::store_kv, Dim3(unsigned(n)), Dim3(128), 0, nullptr,
                     make_ptr(a.memory.data(), a.memory.size()), cache_args(kv, layer), make_ptr(index.data(), n),
                     make_ptr(slots.data(), n), dev(k, rows), dev(v, rows));
  }
  void copy_page(PageId dst, PageId src, ByteRange range) override {
    std::lock_guard lock(mutex_);
    std::byte* to = page_bytes(dst, range);
    std::memcpy(to, page_bytes(src, range), range.bytes);
  }
  Completion copy_to_host(PageId src, ByteRange range, void* dst) override {
    std::lock_guard lock(mutex_);
    std::memcpy(dst, page_bytes(src, range), range.bytes);
    return {};
  }
  Completion copy_from_host(const void* src, PageId dst, ByteRange range) override {
    std::lock_guard lock(mutex_);
    std::memcpy(page_bytes(dst, range), src, range.bytes);
    return {};
  }

  void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
                 std::span<const AttentionGroup> groups, const RopeParams& rope, float scale, float* out) override {
    if (n_q <= 0) return;
    require_types(kv);
    if (kv.head_dim > ck::kMaxHeadDim)
      throw InputError(fmt::format("head dimension {} is above the CUDA attention kernel's {}", kv.head_dim, ck::kMaxHeadDim));
    std::lock_guard lock(mutex_);
    // The groups flattened for the kernels (kernel_args.h): page numbers within one arena, segments, groups.
    Arena* arena = nullptr;
    std::vector<int32_t> page_list, group_of_query(size_t(n_q), -1);
    std::vector<ck::AttnSegment> segments;
    std::vector<ck::AttnGroup> kgroups;
    int max_keys = 0;
    for (const AttentionGroup& g : groups) {
      kgroups.push_back({g.q_begin, g.q_end, int(segments.size()), int(g.segments.size())});
      int keys = 0;
      for (const KvSegment& s : g.segments) {
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
      for (int j = g.q_begin; j < g.q_end; ++j) group_of_query.at(size_t(j)) = int32_t(kgroups.size() - 1);
    }
    if (std::count(group_of_query.begin(), group_of_query.end(), -1) > 0)
      throw std::logic_error("attention: a query row belongs to no group");
    static const std::vector<float> no_memory(1);
    const std::vector<float>& pool = arena ? arena->memory : no_memory;
    const int n_splits = std::max(1, (max_keys + kSplitTokens - 1) / kSplitTokens);
    const size_t parts = size_t(n_q) * size_t(n_heads) * size_t(n_splits), width = size_t(n_heads) * size_t(kv.head_dim);
    part_m_.resize(parts);
    part_l_.resize(parts);
    part_acc_.resize(parts * size_t(kv.head_dim));
    if (page_list.empty()) page_list.push_back(0);  // a kernel argument must point somewhere
    if (segments.empty()) segments.push_back({});
    const ck::AttnCache cache = cache_args(kv, layer);
    cuda::cu::launch("attention_partials", ck::attention_partials,
                     Dim3(unsigned(n_q), unsigned(n_heads), unsigned(n_splits)), Dim3(32), 0, nullptr,
                     dev(q, size_t(n_q) * width), n_heads, make_ptr(pool.data(), pool.size()), cache,
                     make_ptr(page_list.data(), page_list.size()), make_ptr(segments.data(), segments.size()),
                     make_ptr(kgroups.data(), kgroups.size()), make_ptr(group_of_query.data(), group_of_query.size()),
                     rope_args(rope), factors(rope), scale, kSplitTokens, n_splits,
                     make_ptr(part_m_.data(), parts), make_ptr(part_l_.data(), parts),
                     make_ptr(part_acc_.data(), part_acc_.size()));
    cuda::cu::launch("attention_combine", ck::attention_combine, Dim3(unsigned(n_q), unsigned(n_heads)), Dim3(32), 0,
                     nullptr, n_heads, kv.head_dim, n_splits, make_ptr(part_m_.data(), parts),
                     make_ptr(part_l_.data(), parts), make_ptr(part_acc_.data(), part_acc_.size()),
                     dev(out, size_t(n_q) * width));
  }

 private:
  /// Pages of one size, page after page in one allocation; a PageId is (arena << 24 | page).
  struct Arena {
    size_t page_bytes = 0, page_floats = 0;
    std::vector<float> memory;
    std::vector<uint32_t> free;
    uint32_t n_pages = 0;
  };
  static constexpr int kIndexBits = 24;
  static constexpr uint32_t kIndexMask = (uint32_t(1) << kIndexBits) - 1, kPagesPerArena = kIndexMask + 1;
  static constexpr size_t kMaxArenas = 256;

  static std::optional<ck::KvType> kv_type(DType t) {
    if (t == DType::F32) return ck::KvType::F32;
    if (t == DType::F16) return ck::KvType::F16;
    if (t == DType::Q8_0) return ck::KvType::Q8_0;
    return std::nullopt;
  }
  static void require_types(const KvLayout& kv) {
    if (!kv_type(kv.k_type) || !kv_type(kv.v_type))
      throw InputError("the CUDA kernels store KV pages in f32, f16 or q8_0 only",
                       "use --cache-type-k / --cache-type-v f32, f16 or q8_0");
  }
  static ck::AttnCache cache_args(const KvLayout& kv, int layer) {
    return {kv.n_layers, kv.n_kv_heads, kv.head_dim, kv.page_tokens, layer, *kv_type(kv.k_type), *kv_type(kv.v_type)};
  }
  static ck::RopeArgs rope_args(const RopeParams& p) {
    return {p.n_dims, p.freq_base, p.layout == RopeParams::Layout::Interleaved ? 1 : 0, p.freq_factors ? 1 : 0};
  }
  static cuda::cu::Ptr<const float> factors(const RopeParams& p) {
    return p.freq_factors ? make_ptr(p.freq_factors, size_t(p.n_dims / 2)) : cuda::cu::Ptr<const float>();
  }

  /// `bytes` bytes at p, which must lie in one allocation of this backend (not host memory).
  template <class T>
  T* on_device(T* p, size_t bytes, const char* what) const {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = allocations_.upper_bound(at);
    if (it == allocations_.begin() || at + bytes > std::prev(it)->first + std::prev(it)->second)
      throw std::logic_error(fmt::format("{}: {} bytes at {} are not memory of the CUDA backend (a host pointer, or "
                                         "past the end of a Backend::alloc allocation)",
                                         what, bytes, static_cast<const void*>(p)));
    return p;
  }
  /// A kernel's view of n elements at p in this backend's memory.
  template <class T>
  cuda::cu::Ptr<T> dev(T* p, size_t n) const {
    return make_ptr(on_device(p, n * sizeof(T), "kernel argument"), n);
  }

  Arena& arena_of(PageId page) {
    const size_t arena = page >> kIndexBits;
    if (arena >= arenas_.size() || (page & kIndexMask) >= arenas_[arena].n_pages)
      throw std::out_of_range(fmt::format("page {} was not allocated by this backend", page));
    return arenas_[arena];
  }
  /// The arena of a KV page of this layout (all pages a kernel reads must share one, as they share a size).
  Arena& arena_for(const KvLayout& kv, PageId page) {
    Arena& a = arena_of(page);
    if (a.page_bytes != kv.page_bytes())
      throw std::logic_error(fmt::format("page {} holds {} bytes, the KV layout's pages {}", page, a.page_bytes, kv.page_bytes()));
    return a;
  }
  uint32_t page_in(Arena& a, PageId page) {
    if (&arena_of(page) != &a) throw std::logic_error("attention: pages of different sizes in one call");
    return page & kIndexMask;
  }
  std::byte* page_bytes(PageId page, ByteRange range) {
    Arena& a = arena_of(page);
    if (range.offset > a.page_bytes || range.bytes > a.page_bytes - range.offset)
      throw std::out_of_range(fmt::format("bytes [{}, {}) are outside page {} of {} bytes", range.offset,
                                          range.offset + range.bytes, page, a.page_bytes));
    return reinterpret_cast<std::byte*>(a.memory.data() + size_t(page & kIndexMask) * a.page_floats) + range.offset;
  }

  std::mutex mutex_;
  std::map<uintptr_t, size_t> allocations_;  // Backend::alloc: start -> bytes
  int n_threads_ = 1;
  std::vector<Arena> arenas_;
  std::vector<float> part_m_, part_l_, part_acc_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_emulated_backend() { return std::make_unique<EmulatedCudaBackend>(); }

}  // namespace choreo::kernels
