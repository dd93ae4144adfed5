#pragma once
// The compute seam between model code and devices (DESIGN.md §8). Model code calls only this interface;
// kernels/cpu implements it always, kernels/cuda when built with CUDA. Pointers passed to a backend refer
// to memory that backend owns or accepts (host memory for the CPU backend, device memory for CUDA).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace choreo::kernels {

/// A weight matrix as stored in GGUF: n_out rows of n_in elements (ggml shape [n_in, n_out]).
struct Weight {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t n_out = 0;
  int64_t n_in = 0;
  size_t row_stride = 0;  // bytes between rows
  /// The same matrix in a layout or memory of the backend's own (Backend::upload_weight), or null. `data` stays
  /// valid and means the same: a CPU kernel that does not read the packed layout reads the rows; the CUDA
  /// backend keeps its device copy of the rows here.
  std::shared_ptr<const void> packed;
};

/// One product of a group (Backend::matmul_group): y = w · x, y of [n, w->n_out] floats.
struct MatmulOutput {
  const Weight* w = nullptr;
  float* y = nullptr;
};

/// How rotary embeddings are applied. Angles are linear in the position, so a rotation by a then by b equals
/// one by a+b; virtual repositioning relies on that.
struct RopeParams {
  enum class Layout { Interleaved, Halves };  // adjacent pairs (llama GGUF) / first-half with second-half (NeoX)
  Layout layout = Layout::Interleaved;
  int n_dims = 0;               // rotated dims per head (== head_dim for llama)
  float freq_base = 10000.0f;
  const float* freq_factors = nullptr;  // Llama-3 rope scaling: n_dims/2 divisors of the frequencies, or null
};

/// A KV page: an id that the backend which allocated it resolves to its own memory (host memory on the CPU,
/// device memory under CUDA). Model and tier code hold ids, never pointers into pages.
using PageId = uint32_t;

/// Bytes [offset, offset + bytes) of a page.
struct ByteRange {
  size_t offset = 0;
  size_t bytes = 0;
};

/// The most tokens a KV page may hold (the --page-tokens bound).
constexpr int kMaxPageTokens = 4096;

/// Layout of one KV page (page_tokens tokens, every layer). Every K of the page comes first, then every V;
/// within each, layer after layer, so the K or the V of one layer of a page is one contiguous range
/// (layer_k, layer_v) that can be copied on its own.
/// - K in f32 (the reference) is stored head-dimension-major per layer and KV head,
///   [n_layers][n_kv_heads][head_dim][page_tokens], so attention reads a head's keys as a ready
///   [head_dim x page_tokens] tile. K in f16 or q8_0 is token-major, [n_layers][page_tokens] rows of kv_dim
///   elements (heads consecutive) encoded in k_type, as llama.cpp's cache types.
/// - V is token-major in every type, [n_layers][page_tokens] rows of kv_dim elements in v_type.
/// q8_0 blocks hold 32 elements and never straddle heads: it needs head_dim % 32 == 0 (check()).
struct KvLayout {
  int page_tokens = 32;
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  DType k_type = DType::F32;
  DType v_type = DType::F32;
  int kv_dim() const { return n_kv_heads * head_dim; }
  /// Pages that hold `n_tokens` tokens.
  size_t pages_for(size_t n_tokens) const { return (n_tokens + page_tokens - 1) / page_tokens; }
  bool is_f32() const { return k_type == DType::F32 && v_type == DType::F32; }
  size_t k_row_bytes() const { return row_bytes(k_type, kv_dim()); }
  size_t v_row_bytes() const { return row_bytes(v_type, kv_dim()); }
  size_t page_bytes() const { return size_t(n_layers) * page_tokens * (k_row_bytes() + v_row_bytes()); }
  /// The keys / values of one layer of a page.
  ByteRange layer_k(int layer) const {
    return {size_t(layer) * page_tokens * k_row_bytes(), size_t(page_tokens) * k_row_bytes()};
  }
  ByteRange layer_v(int layer) const {
    return {size_t(n_layers) * page_tokens * k_row_bytes() + size_t(layer) * page_tokens * v_row_bytes(),
            size_t(page_tokens) * v_row_bytes()};
  }
  /// f32 keys: start (in floats) of the [head_dim][page_tokens] key tile of one layer and KV head.
  size_t k_tile(int layer, int kv_head) const { return (size_t(layer) * n_kv_heads + kv_head) * head_dim * page_tokens; }
  /// Throws InputError when the types cannot hold this shape (a cache type choreo does not store, or q8_0
  /// with a head dimension that is not a multiple of 32).
  void check() const;
  /// Encodes one token's key and value rows (kv_dim floats each, heads consecutive) into a page held in host
  /// memory, at a slot, in the layout's types.
  void write_k(std::byte* page, int layer, int slot, const float* k_row) const;
  void write_v(std::byte* page, int layer, int slot, const float* v_row) const;
  /// Decodes them (exact for f32; the stored value for f16 and q8_0).
  void read_k(const std::byte* page, int layer, int slot, float* k_row) const;
  void read_v(const std::byte* page, int layer, int slot, float* v_row) const;
};

/// Parses a KV cache type as llama.cpp's -ctk/-ctv name them: "f32", "f16" or "q8_0"; throws InputError.
DType parse_kv_type(std::string_view name);
/// The name parse_kv_type reads back ("f32", "f16", "q8_0"); other types by their ggml name.
std::string_view kv_type_name(DType t);

/// A run of cached tokens visible to some queries: the tokens live in `pages` (in order), their keys were
/// rotated at their encoded positions, and they are logically placed `delta` positions later.
/// With causal_base >= 0, query j of its group sees only tokens [0, causal_base + j] (a message's own tokens).
struct KvSegment {
  std::span<const PageId> pages;
  int n_tokens = 0;
  int delta = 0;
  int causal_base = -1;
};

/// Completion of an asynchronous copy. wait() blocks until it is done and rethrows its failure; a
/// default-constructed Completion is already done.
class Completion {
 public:
  Completion() = default;
  explicit Completion(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() const {
    if (done_.valid()) done_.get();
  }
  bool ready() const {
    return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
};

/// Query rows [q_begin, q_end) that share one view of the cache.
struct AttentionGroup {
  int q_begin = 0;
  int q_end = 0;
  std::span<const KvSegment> segments;
};

/// The operations a forward pass needs. All activations are fp32, row-major.
///
/// Memory: activations, the normalisation weights and every other float array an operation reads or writes
/// are the backend's own memory (alloc; host memory on the CPU, device memory under CUDA), which model code
/// never dereferences: it moves data in with upload, out with download, and between buffers with copy.
/// Small per-call metadata stays in host memory: token ids, positions, page ids and slots, attention groups
/// and RoPE's frequency factors. Weights are prepared by upload_weight, KV pages by alloc_page.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual void set_threads(int n_threads) = 0;
  virtual int threads() const = 0;

  /// `bytes` bytes of the backend's memory (64-byte aligned), or std::bad_alloc.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  /// Host memory that the asynchronous page copies (copy_to_host / copy_from_host) can use as it is: pinned
  /// (page-locked) under CUDA, so that a tier copy is a DMA on the copy stream instead of one the driver stages
  /// through a buffer of its own and waits for. The KV tiers' host copies (T1) live here. 64-byte aligned; the
  /// CPU backend's is ordinary memory. A device backend throws InputError when it cannot pin that much.
  virtual void* alloc_host(size_t bytes) { return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(64)); }
  /// Frees alloc_host memory, once no copy uses it.
  virtual void release_host(void* p) { ::operator delete(p, std::align_val_t(64)); }
  /// A device's memory: what is free now (beside the weights and everything else allocated) and in all.
  struct DeviceMemory {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
  };
  /// The memory of a backend whose memory is a device's; nullopt when it is the host's (the CPU backend,
  /// bounded by the budgets alone) or has no known limit.
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  /// The T0 budget (kv::PagePool's, the CLI's --cache-mib) within which KV pages will be allocated here; the
  /// last pool made tells it. A device backend names it in its out-of-memory errors and grows its page memory
  /// no further than the budget needs.
  virtual void set_kv_budget(size_t budget_bytes) {}

  /// Copies between host memory and the backend's memory, and within the backend's memory. They are done when
  /// they return.
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;

  /// Prepares a weight for this backend's matrix products, once, at load (DESIGN.md §8: weights are uploaded
  /// once). The result may carry a copy in the backend's own layout (Weight::packed), owned by the result.
  virtual Weight upload_weight(const Weight& w) = 0;
  /// Prepares an embedding table, read by `embed` only (never by matmul), once, at load. The CPU backend reads
  /// the rows in place; a device backend copies them to its memory (Weight::packed).
  virtual Weight upload_table(const Weight& table) = 0;
  /// y[i, :] = W · x[i, :] for i < n.   x: [n, n_in], y: [n, n_out].
  virtual void matmul(const Weight& w, const float* x, int n, float* y) = 0;
  /// matmul of one input x ([n, n_in]) by several weights of that n_in (a layer's q, k and v projections,
  /// or its gate and up), each into its own output. The results are matmul's, weight by weight, bit for bit;
  /// a backend may run the group as one product (the CPU backend: one loop, the input quantised once).
  virtual void matmul_group(std::span<const MatmulOutput> outputs, const float* x, int n) = 0;
  /// out[i, :] = row ids[i] of the table, dequantised.
  virtual void embed(const Weight& table, std::span<const int32_t> ids, float* out) = 0;
  /// out[i, :] = x[i, :] / rms(x[i, :]) * weight.
  virtual void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) = 0;
  /// Rotates each head of x[i] (n_heads heads of head_dim) by position pos[i].
  virtual void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const RopeParams& p) = 0;
  /// out = silu(gate) * up, elementwise over n values.
  virtual void swiglu(const float* gate, const float* up, size_t n, float* out) = 0;
  /// x += y over n values.
  virtual void add(float* x, const float* y, size_t n) = 0;
  /// x *= s over n values.
  virtual void scale(float* x, size_t n, float s) = 0;
  /// A LoRA pair's update (runtime/model/lora.h): y[i, :] += factor · B · (A · x[i, :]) for i < n, with A of
  /// rank rows of n_in and B of n_out rows of rank: x is [n, a.n_in], y is [n, b.n_out]. `scratch` is n *
  /// (a.n_out + b.n_out) floats of this backend's memory, the caller's. Shapes that do not chain, or n < 0,
  /// throw std::invalid_argument (check_lora). This default is the two products, then scale, then add, in
  /// scratch (llama.cpp's order, and the CPU backend's); a device backend may compute it in one kernel.
  virtual void add_lora(const Weight& a, const Weight& b, float factor, const float* x, int n, float* y,
                        float* scratch);
  /// True when store_kv and attention take pages of this layout's cache types (both backends: every type
  /// KvLayout::check accepts, f32, f16 and q8_0).
  virtual bool supports_kv(const KvLayout& kv) const { return true; }
  /// KV page memory, owned by the backend. A new page holds `bytes` zero bytes; alloc_page throws
  /// std::bad_alloc, or a device backend the InputError of a full device, when there is no room (budgets are
  /// kept above this, by kv::PagePool).
  virtual PageId alloc_page(size_t bytes) = 0;
  virtual void free_page(PageId page) = 0;
  /// Stores the keys and values of n tokens of one layer (k, v: [n, kv_dim], keys already rotated): token i
  /// goes to slot slots[i] of pages[i], encoded in the layout's types.
  virtual void store_kv(const KvLayout& kv, int layer, std::span<const PageId> pages,
                        std::span<const int32_t> slots, const float* k, const float* v) = 0;
  /// Copies `range` of page src to the same range of page dst, in the backend's memory.
  virtual void copy_page(PageId dst, PageId src, ByteRange range) = 0;
  /// Asynchronous copies between `range` of a page and host memory. Until the returned Completion is done,
  /// the host buffer must stay valid and the page must be neither written nor freed.
  virtual Completion copy_to_host(PageId src, ByteRange range, void* dst) = 0;
  virtual Completion copy_from_host(const void* src, PageId dst, ByteRange range) = 0;

  // ---- Batched tier copies (page gather / scatter) ----
  /// Asynchronous copies of `range` of every page of a list (a message's pages, or one layer's K or V of
  /// each) to and from one host buffer of pages.size() * range.bytes bytes, piece i at i * range.bytes: the
  /// bytes of a copy_to_host / copy_from_host per page, as one transfer (a device backend gathers the pieces
  /// into its own memory first, or scatters them from it after). Every page and the range are checked before
  /// anything is copied (std::out_of_range); copy_pages_from_host refuses a page listed twice
  /// (std::invalid_argument): which copy landed last would decide the result. An empty list is done at once.
  /// Until the Completion is done, the host buffer must stay valid and the pages must be neither written nor
  /// freed. Ranges of KvLayout::layer_k / layer_v start and end on 2-byte boundaries only (f16 rows are
  /// 2 * kv_dim bytes, q8_0 rows 34 * kv_dim / 32), on 4-byte ones for f32; any byte range is accepted.
  virtual Completion copy_pages_to_host(std::span<const PageId> pages, ByteRange range, void* dst) = 0;
  virtual Completion copy_pages_from_host(const void* src, std::span<const PageId> pages,
                                          ByteRange range) = 0;
  /// Re-rotates stored keys by `delta` positions: the paper's destructive repositioning (DESIGN.md §2), which
  /// the engine keeps as a reference path (Repositioning::KeyRerotation) beside virtual repositioning. For each
  /// of the first n_tokens tokens of the list (token t in slot t % page_tokens of page t / page_tokens), in
  /// every layer, the key is decoded as KvLayout::read_k decodes it, each KV head rotated as `rope` rotates a
  /// row at position delta, and encoded again as KvLayout::write_k encodes it, into the same slot of to[i]: the
  /// bits of that row-by-row sequence, done here in one operation. A page of `to` other than its `from` page
  /// first becomes a copy of it (every byte: the values, and the slots past n_tokens); to[i] == from[i]
  /// re-rotates in place. Arguments check_rerotate refuses are std::invalid_argument.
  virtual void rerotate_keys(const KvLayout& kv, std::span<const PageId> from, std::span<const PageId> to,
                             int n_tokens, int delta, const RopeParams& rope) = 0;
  /// Softmax attention of q ([n_q, n_heads*head_dim], rotated at each query's own position) over the
  /// segments of each group, for one layer; writes out [n_q, n_heads*head_dim]. A segment with delta != 0 is
  /// attended by rotating the query by -delta (virtual repositioning), never by touching stored keys.
  virtual void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
                         std::span<const AttentionGroup> groups, const RopeParams& rope, float scale,
                         float* out) = 0;

  // ---- Sampling helpers (issue 14): on the logits where they were computed, so that only candidates
  // travel to the host. Every row is computed on its own, in a fixed order: a row's results never depend on
  // n_rows (batch invariance). Logits must not be NaN.
  /// For each of n_rows rows of n_vocab logits, the k largest in model::Sampler's order: value descending,
  /// ties broken by the lower index first; row r's are written to ids[r*k, (r+1)*k) (their indices in the
  /// row) and values[r*k, (r+1)*k) (the logits, exactly). k = 1 is model::argmax (the first index on ties).
  /// logits, ids and values are the backend's memory. k < 1 or k > n_vocab, or n_rows < 0, throws
  /// std::invalid_argument (check_top_k).
  virtual void top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values) = 0;
  /// out[r, i] = exp((x[r, i] - max_r) / temperature) / sum_r over n_rows rows of n values, with the
  /// exponentials in double and summed in double in an order fixed by n alone; each result rounded once to
  /// float. x and out ([n_rows, n]) are the backend's memory. temperature <= 0 (or not finite), n < 1 or
  /// n_rows < 0 throws std::invalid_argument (check_softmax).
  virtual void softmax(const float* x, int n_rows, int n, float temperature, float* out) = 0;
  /// Whether a decode should find its sampling candidates here (top_k) and download only those, rather than
  /// download every logit and sample on the host: true for a device backend, where the logits are in device
  /// memory; false for the CPU backend, whose logits are host memory already.
  virtual bool prefers_device_sampling() const { return false; }
};

/// An array of T in a backend's memory (Backend::alloc), released with it. Its elements are not readable from
/// the host except through the backend (Backend::download), unless the backend is the CPU's.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, size_t n) : backend_(&backend), n_(n) {
    if (n > 0) data_ = static_cast<T*>(backend.alloc(n * sizeof(T)));
  }
  /// A copy of host values.
  Buffer(Backend& backend, std::span<const T> host) : Buffer(backend, host.size()) { upload(host); }
  Buffer(Buffer&& o) noexcept : backend_(o.backend_), data_(o.data_), n_(o.n_) {
    o.data_ = nullptr;
    o.n_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~Buffer() {
    if (data_) backend_->release(data_);
  }
  T* data() const { return data_; }
  size_t size() const { return n_; }
  /// At least n elements; the contents are not kept when it grows.
  void reserve(Backend& backend, size_t n) {
    if (n > n_ || backend_ != &backend) *this = Buffer(backend, n);
  }
  /// The first host.size() elements from / to host memory.
  void upload(std::span<const T> host) const { backend_->upload(data_, host.data(), host.size_bytes()); }
  void download(std::span<T> host) const { backend_->download(host.data(), data_, host.size_bytes()); }

 private:
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t n_ = 0;
};

/// Throws std::invalid_argument when a page appears twice in `pages` (copy_pages_from_host's precondition).
inline void require_distinct_pages(std::span<const PageId> pages) {
  std::vector<PageId> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end())
    throw std::invalid_argument("a copy to KV pages lists page " + std::to_string(*twice) + " twice");
}

/// Throws std::invalid_argument unless rerotate_keys's arguments are valid: as many `to` pages as `from` pages,
/// enough for 0 <= n_tokens; no page twice in `to`; a page of `to` either its own `from` page or none of them
/// (else one token's keys would be read after another's were written there).
inline void check_rerotate(const KvLayout& kv, std::span<const PageId> from, std::span<const PageId> to,
                           int n_tokens) {
  if (from.size() != to.size())
    throw std::invalid_argument("rerotate_keys: " + std::to_string(from.size()) + " pages to read but " +
                                std::to_string(to.size()) + " to write");
  if (n_tokens < 0 || kv.pages_for(size_t(n_tokens)) > from.size())
    throw std::invalid_argument("rerotate_keys: " + std::to_string(n_tokens) + " tokens in " +
                                std::to_string(from.size()) + " pages of " + std::to_string(kv.page_tokens));
  require_distinct_pages(to);
  std::vector<PageId> sources(from.begin(), from.end());
  std::sort(sources.begin(), sources.end());
  for (size_t i = 0; i < to.size(); ++i)
    if (to[i] != from[i] && std::binary_search(sources.begin(), sources.end(), to[i]))
      throw std::invalid_argument("rerotate_keys: page " + std::to_string(to[i]) +
                                  " is written as a copy of another page and read as a source too");
}

/// Throws std::invalid_argument unless top_k's arguments are valid: 1 <= k <= n_vocab, n_rows >= 0.
inline void check_top_k(int n_rows, int n_vocab, int k) {
  if (n_rows < 0) throw std::invalid_argument("top_k over " + std::to_string(n_rows) + " rows");
  if (k < 1 || k > n_vocab)
    throw std::invalid_argument("top_k: k = " + std::to_string(k) + " is outside [1, " + std::to_string(n_vocab) +
                                "] (the row's logits)");
}
/// Throws std::invalid_argument unless softmax's arguments are valid: temperature > 0 and finite, n >= 1,
/// n_rows >= 0.
inline void check_softmax(int n_rows, int n, float temperature) {
  if (n_rows < 0 || n < 1)
    throw std::invalid_argument("softmax over " + std::to_string(n_rows) + " rows of " + std::to_string(n) + " values");
  if (!(temperature > 0.0f) || temperature == std::numeric_limits<float>::infinity())
    throw std::invalid_argument("softmax at temperature " + std::to_string(temperature) +
                                ": it must be positive and finite");
}

/// Throws std::invalid_argument unless add_lora's arguments are valid: B's rows as long as A has rows (the
/// rank, at least 1), n >= 0.
inline void check_lora(const Weight& a, const Weight& b, int n) {
  if (n < 0) throw std::invalid_argument("add_lora over " + std::to_string(n) + " rows");
  if (a.n_out < 1 || b.n_in != a.n_out)
    throw std::invalid_argument("add_lora: A has " + std::to_string(a.n_out) + " rows (the rank) but B's rows hold " +
                                std::to_string(b.n_in) + " values");
}

inline void Backend::add_lora(const Weight& a, const Weight& b, float factor, const float* x, int n, float* y,
                              float* scratch) {
  check_lora(a, b, n);
  if (n == 0) return;
  const size_t outputs = size_t(n) * size_t(b.n_out);
  float* const ranked = scratch;  // n × rank: A · x
  float* const product = scratch + size_t(n) * size_t(a.n_out);  // n × n_out: B · (A · x)
  matmul(a, x, n, ranked);
  matmul(b, ranked, n, product);
  scale(product, outputs, factor);
  add(y, product, outputs);
}

/// The most threads a backend accepts (llama.cpp's limit too); far more than this exhausts the process.
constexpr int kMaxThreads = 512;

/// The CPU backend (always available); picks SIMD kernels for this processor at run time. n_threads <= 0
/// means one per core; more than kMaxThreads is an InputError.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

/// The CUDA backend (kernels/cuda/backend_core.h) on the CPU: its kernels (kernels/cuda/kernels) run through
/// the block emulator (kernels/cuda/emu/emulated_backend.cc), every launch checked for out-of-bounds accesses
/// and shared-memory races, every array checked to be the backend's memory. Slow (one fiber per CUDA thread):
/// for tests and for checking kernels, on stories260K-sized models. Reads F32/F16/BF16/Q8_0/Q4_0/Q4_1 weights
/// and f32/f16/q8_0 KV pages; other weights are an InputError.
/// `device_bytes` > 0 gives the emulated device that much memory: an allocation beyond it fails as it does on
/// a GPU that is full (an InputError naming the KV budget), and device_memory() reports it. 0: unlimited.
std::unique_ptr<Backend> make_cuda_emulated_backend(size_t device_bytes = 0);

/// The page copies (copy_to_host / copy_from_host) a backend made by make_cuda_emulated_backend has done, by
/// where their host side lay: in alloc_host memory (pinned on a GPU) or elsewhere (pageable), with their bytes.
/// For tests: T1's copies must be pinned ones.
struct HostCopyCounts {
  uint64_t pinned = 0;
  uint64_t pinned_bytes = 0;
  uint64_t pageable = 0;
  uint64_t pageable_bytes = 0;
};
/// Throws std::invalid_argument for a backend that make_cuda_emulated_backend did not make.
HostCopyCounts emulated_host_copies(const Backend& backend);

/// The backend a command runs on, by name: "cpu" (n_threads threads), "cuda" (device `device`: an InputError
/// when this build has no CUDA or the machine no device) or "cuda-emulated" (with the memory that
/// $CHOREO_EMULATED_DEVICE_MIB gives it, a test knob; unset: unlimited). Unknown names are an InputError.
std::unique_ptr<Backend> make_backend(std::string_view name, int n_threads, int device = 0);
/// Whether this build includes the CUDA device backend (nvcc was found), and the devices the driver reports
/// (0 without CUDA, without a driver or without a GPU).
bool built_with_cuda();
int cuda_device_count();
/// In a build with the CUDA backend, loads cuBLASLt as `--backend cuda` does when it makes its device (the
/// library is opened with dlopen, not linked) and returns true; an InputError when it cannot be loaded or lacks
/// a function the backend calls. False in a build without the CUDA backend. Needs no GPU.
bool load_cuda_blas();

}  // namespace choreo::kernels
