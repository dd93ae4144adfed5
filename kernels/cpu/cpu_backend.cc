// The CPU implementation of kernels::Backend: matrix products from kernels/cpu/matmul, attention and
// elementwise ops from their own files. Threads are the kernel pool's (thread_pool.h), sized by set_threads.

#include <algorithm>
#include <cstring>
#include <new>

#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/pages.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/thread_pool.h"

namespace choreo::kernels {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) { set_threads(n_threads); }

  std::string name() const override { return "cpu"; }
  void set_threads(int n_threads) override {
    if (n_threads > kMaxThreads)
      throw InputError(fmt::format("{} threads requested; the CPU backend takes at most {}", n_threads, kMaxThreads),
                       "use one thread per core (the default), or fewer");
    n_threads_ = n_threads > 0 ? n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    cpu::kernel_pool().set_threads(n_threads_);
  }
  int threads() const override { return n_threads_; }

  void* alloc(size_t bytes) override { return ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64)); }
  void release(void* p) override { ::operator delete(p, std::align_val_t(64)); }
  void upload(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void download(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }

  Weight upload_weight(const Weight& w) override {
    Weight uploaded = w;
    uploaded.packed = cpu::pack_weight(w);
    return uploaded;
  }
  Weight upload_table(const Weight& table) override { return table; }  // embed reads the rows in place
  void matmul(const Weight& w, const float* x, int n, float* y) override { cpu::matmul(w, x, n, y); }
  void matmul_group(std::span<const MatmulOutput> outputs, const float* x, int n) override {
    cpu::matmul_group(outputs, x, n);
  }
  void embed(const Weight& table, std::span<const int32_t> ids, float* out) override {
    cpu::dequantize_rows(table, ids, out);
  }
  void rmsnorm(const float* x, const float* weight, int n, int dim, float eps, float* out) override {
    cpu::rmsnorm(x, weight, n, dim, eps, out);
  }
  void rope(float* x, int n, int n_heads, int head_dim, const int32_t* pos, const RopeParams& p) override {
    cpu::rope(x, n, n_heads, head_dim, pos, p);
  }
  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
    cpu::swiglu(gate, up, n, out);
  }
  void add(float* x, const float* y, size_t n) override { cpu::add(x, y, n); }
  void scale(float* x, size_t n, float s) override { cpu::scale(x, n, s); }
  void attention(int layer, const float* q, int n_q, int n_heads, const KvLayout& kv,
                 std::span<const AttentionGroup> groups, const RopeParams& rope, float scale,
                 float* out) override {
    cpu::attention(layer, q, n_q, n_heads, kv, pages_, groups, rope, scale, out);
  }
  void top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values) override {
    cpu::top_k(logits, n_rows, n_vocab, k, ids, values);
  }
  void softmax(const float* x, int n_rows, int n, float temperature, float* out) override {
    cpu::softmax(x, n_rows, n, temperature, out);
  }

  PageId alloc_page(size_t bytes) override { return pages_.allocate(bytes); }
  void free_page(PageId page) override { pages_.free(page); }
  void store_kv(const KvLayout& kv, int layer, std::span<const PageId> pages, std::span<const int32_t> slots,
                const float* k, const float* v) override {
    const size_t kv_dim = size_t(kv.kv_dim());
    for (size_t i = 0; i < pages.size(); ++i) {
      std::byte* page = pages_.get(pages[i]);
      kv.write_k(page, layer, slots[i], k + i * kv_dim);
      kv.write_v(page, layer, slots[i], v + i * kv_dim);
    }
  }
  void copy_page(PageId dst, PageId src, ByteRange range) override {
    pages_.check_range(src, range);
    pages_.check_range(dst, range);
    std::memcpy(pages_.get(dst) + range.offset, pages_.get(src) + range.offset, range.bytes);
  }
  void rerotate_keys(const KvLayout& kv, std::span<const PageId> from, std::span<const PageId> to, int n_tokens,
                     int delta, const RopeParams& rope) override {
    cpu::rerotate_keys(pages_, kv, from, to, n_tokens, delta, rope);
  }
  Completion copy_to_host(PageId src, ByteRange range, void* dst) override {
    pages_.check_range(src, range);
    const std::byte* from = pages_.get(src) + range.offset;
    return copies_.submit([=] { std::memcpy(dst, from, range.bytes); });
  }
  Completion copy_from_host(const void* src, PageId dst, ByteRange range) override {
    pages_.check_range(dst, range);
    std::byte* to = pages_.get(dst) + range.offset;
    return copies_.submit([=] { std::memcpy(to, src, range.bytes); });
  }
  // Batched tier copies: every page and the range checked first, then one job of a memcpy per page.
  Completion copy_pages_to_host(std::span<const PageId> pages, ByteRange range, void* dst) override {
    std::vector<std::byte*> from = checked_pieces(pages, range);
    if (from.empty()) return {};
    return copies_.submit([from = std::move(from), range, to = static_cast<std::byte*>(dst)] {
      for (size_t i = 0; i < from.size(); ++i) std::memcpy(to + i * range.bytes, from[i], range.bytes);
    });
  }
  Completion copy_pages_from_host(const void* src, std::span<const PageId> pages, ByteRange range) override {
    require_distinct_pages(pages);
    std::vector<std::byte*> to = checked_pieces(pages, range);
    if (to.empty()) return {};
    return copies_.submit([to = std::move(to), range, from = static_cast<const std::byte*>(src)] {
      for (size_t i = 0; i < to.size(); ++i) std::memcpy(to[i], from + i * range.bytes, range.bytes);
    });
  }

 private:
  /// Where `range` of each page lies, every page and the range checked first (std::out_of_range).
  std::vector<std::byte*> checked_pieces(std::span<const PageId> pages, ByteRange range) {
    std::vector<std::byte*> at;
    at.reserve(pages.size());
    for (PageId p : pages) {
      pages_.check_range(p, range);
      at.push_back(pages_.get(p) + range.offset);
    }
    return at;
  }
  int n_threads_ = 1;
  cpu::PageTable pages_;
  cpu::CopyWorker copies_;  // declared last: its thread stops (after finishing its jobs) before the pages go
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace choreo::kernels
