#pragma once
// The CUDA backend's host logic, written once and compiled twice (issue 14):
// - by the host compiler with the emulated device (kernels/cuda/emu/emulated_backend.cc), where every launch
//   runs in the block emulator and every array an operation touches is checked against the allocations;
// - by nvcc with the CUDA runtime (kernels/cuda/device/cuda_backend.cu), where launches are <<<>>> on a stream.
// Everything but the memory and copy layer (`Device`) is CoreBackend: weights copied to device memory at load,
// KV page arenas (one allocation per page size, indexed by page number: tier 0), the flattening of attention
// groups and per-call metadata staged into device memory, launch geometry, scratch for split-K partials. So
// all of it runs, checked, on a machine without a GPU; only the Device layer below is left for a GPU to test.
//
// This file is the class and what every operation shares (memory, staging, the kernels' views of weights and
// caches). The operations are defined by op family beside their kernels, as kernels/cpu/ is split:
// linear_backend.cuh (weights, products, embedding), elementwise_backend.cuh, attention_backend.cuh (store_kv,
// attention), pages_backend.cuh (page arenas and every page copy), sampling_backend.cuh, lora_backend.cuh.
// A Device's translation unit includes kernels/cuda/backend.cuh, which includes them all.
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

  // ---- Weights and matrix products (linear_backend.cuh) ----
  /// Weights are copied to device memory once, as stored (the kernels read every format in place);
  /// Weight::packed owns the copy, Weight::data stays the host rows.
  Weight upload_weight(const Weight& w) override;
  /// F32, F16 and BF16 weights: one GEMM in cuBLAS's conventions (kernels/cuda/blas.h: on a GPU cuBLASLt with
  /// a pinned algorithm, in emulation a CPU GEMM summing over k in order), the activations rounded to the
  /// weight's type first when it is F16 or BF16 (cuBLAS's operands share one type; llama.cpp's CUDA backend
  /// does the same). The quantised formats: the linear kernel, dequantising the blocks on the fly. Either way a
  /// row's bits do not depend on the other rows of the product.
  void matmul(const Weight& w, const float* x, int n, float* y) override;
  void matmul_group(std::span<const choreo::kernels::MatmulOutput> outputs, const float* x, int n) override;
  void embed(const Weight& table, std::span<const int32_t> ids, float* out) override;
  Weight upload_table(const Weight& table) override { return upload_weight(table); }

  // ---- Elementwise (elementwise_backend.cuh) ----
  void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) override;
  void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const choreo::kernels::RopeParams& p) override;
  void swiglu(const float* gate, const float* up, size_t n, float* out) override;
  void add(float* x, const float* y, size_t n) override;
  void scale(float* x, size_t n, float s) override;

  // ---- KV pages (pages_backend.cuh; store_kv beside attention, whose kernels read what it writes) ----
  bool supports_kv(const KvLayout& kv) const override { return kv_type(kv.k_type) && kv_type(kv.v_type); }
  PageId alloc_page(size_t bytes) override;
  void free_page(PageId page) override;
  void copy_page(PageId dst, PageId src, ByteRange range) override;
  Completion copy_to_host(PageId src, ByteRange range, void* dst) override;
  Completion copy_from_host(const void* src, PageId dst, ByteRange range) override;
  Completion copy_pages_to_host(std::span<const PageId> pages, ByteRange range, void* dst) override;
  Completion copy_pages_from_host(const void* src, std::span<const PageId> pages, ByteRange range) override;
  /// The copies (one device copy per page of `to` that is not its `from` page), then one launch of
  /// rerotate_keys (kernels/cuda/kernels/rerotate.cuh) over (token, layer), in place on `to`.
  void rerotate_keys(const KvLayout& kv, std::span<const PageId> from, std::span<const PageId> to, int n_tokens,
                     int delta, const choreo::kernels::RopeParams& rope) override;

  // ---- Attention (attention_backend.cuh) ----
  void store_kv(const KvLayout& kv, int layer, std::span<const PageId> pages, std::span<const int32_t> slots,
                const float* k, const float* v) override;
  void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
                 std::span<const choreo::kernels::AttentionGroup> groups, const choreo::kernels::RopeParams& rope,
                 float scale, float* out) override;

  // ---- Sampling helpers (sampling_backend.cuh): one block per row ----
  void top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values) override;
  void softmax(const float* x, int n_rows, int n, float temperature, float* out) override;

  // ---- LoRA (lora_backend.cuh): one block per row ----
  /// F32, F16 and BF16 pairs of rank up to kLoraMaxRank: the lora kernel, with f32 activations (the default
  /// path would round them to F16/BF16 for cuBLAS) and without scratch. Quantised adapters and larger ranks:
  /// the default two products (Backend::add_lora), whose rows are batch invariant too.
  void add_lora(const Weight& a, const Weight& b, float factor, const float* x, int n, float* y,
                float* scratch) override;

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
  static std::optional<blas::Type> gemm_type(const Weight& w);
  void gemm_product(const Weight& w, blas::Type t, const float* x, int n, float* y);

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
  void grow(Arena& a);
  static cu::Ptr<float> pool(const Arena& a) { return cu::make_ptr(a.memory, size_t(a.n_pages) * a.page_floats); }
  Arena& arena_of(PageId page);
  /// The arena of a KV page of this layout (all pages a kernel reads must share one, as they share a size).
  Arena& arena_for(const KvLayout& kv, PageId page);
  uint32_t page_in(Arena& a, PageId page);
  std::byte* page_bytes(PageId page, ByteRange range);

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
  PageRuns page_runs(std::span<const PageId> pages, ByteRange range);
  /// A staging range of the pinned pool, returned to it unless handed to a Transfer.
  struct PoolRelease {
    PinnedPool* pool;
    void operator()(void* p) const { pool->release(p); }
  };
  using Staged = std::unique_ptr<std::byte, PoolRelease>;
  /// A pinned staging range for `bytes` of the caller's host memory at `host`, or null when that memory is the
  /// pool's already (pinned) or there is nothing to copy; `fill_from`, when not null, is copied into it.
  Staged stage(const void* host, size_t bytes, const void* fill_from);
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
  Transfer& transfer(const PageRuns& runs);
  /// Launches, on the copy stream, gather_pages (from the arenas into the transfer buffer) or scatter_pages
  /// (back) over each run, in the widest word its arena's page stride and the range allow.
  void move_pieces(const PageRuns& runs, const Transfer& t, ByteRange range, bool to_pages);
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
