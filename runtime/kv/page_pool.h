#pragma once
// Fixed-size KV pages (DESIGN.md §3): each page holds K and V of page_tokens tokens for every layer.
// The pool bounds memory; the tier-0 budget of the message store is this pool's budget. The pages themselves
// are the backend's (kernels::Backend::alloc_page): the pool holds their ids and keeps the accounting.

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "kernels/backend.h"

namespace choreo::kv {

/// Allocates and recycles KV pages of one layout within a byte budget.
class PagePool {
 public:
  /// Throws InputError when the layout's cache types cannot hold the model's shape (KvLayout::check), or when
  /// the backend's memory is a device's and the budget does not fit in what it has free (beside the weights:
  /// load the model first). Tells the backend the budget (Backend::set_kv_budget).
  PagePool(kernels::Backend& backend, const kernels::KvLayout& layout, size_t budget_bytes);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  /// A zeroed page. When the budget is spent, asks the reclaimer to free pages first; throws InputError
  /// (context/cache budget exceeded) when there is none or it frees nothing. Host pages also stop at what the
  /// process's memory limits leave (common/memory_limits.h): the budget then shrinks to the pages held, and
  /// OutOfMemory says so when nothing can be freed.
  kernels::PageId allocate();
  /// Called when an allocation would exceed the budget (the engine's tiers evict a message): returns true
  /// after releasing at least one page to this pool, false when nothing can go; may throw its own error.
  void set_reclaimer(std::function<bool()> reclaimer) { reclaimer_ = std::move(reclaimer); }
  void release(kernels::PageId page);
  /// Charges bytes held beside the pages (a message's E cache, DESIGN.md §6) to the budget, asking the
  /// reclaimer for room first as allocate() does. False, charging nothing, when the room cannot be made.
  bool charge(size_t bytes);
  void uncharge(size_t bytes);
  size_t charged_bytes() const { return charged_; }

  kernels::Backend& backend() const { return backend_; }
  const kernels::KvLayout& layout() const { return layout_; }
  size_t page_bytes() const { return layout_.page_bytes(); }
  size_t pages_in_use() const { return in_use_; }
  /// Pages and charged bytes.
  size_t bytes_in_use() const { return in_use_ * page_bytes() + charged_; }
  size_t budget_bytes() const { return budget_bytes_; }
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  kernels::Backend& backend_;
  kernels::KvLayout layout_;
  size_t budget_bytes_;
  size_t in_use_ = 0;
  size_t charged_ = 0;
  size_t peak_bytes_ = 0;
  std::function<bool()> reclaimer_;
  bool host_memory_ = false;     // pages live in this process's memory (not a device's)
  bool memory_bounded_ = false;  // the budget was cut to what the memory limits leave

  /// Makes the pages held the budget: memory ran out, or would leave too little, below the budget.
  void fit_budget_to_memory();
};

/// `budget_bytes`, or the free memory of the backend's device when that is less: the T0 budget of a pool that
/// no flag sets (bench, finetune, warm-ups), meant as "no limit", which the device check of PagePool must not refuse.
size_t budget_within_device(const kernels::Backend& backend, size_t budget_bytes);

/// The pages of one growing token sequence (a plain KV-cache run, or one message's own tokens).
class PageList {
 public:
  explicit PageList(PagePool& pool) : pool_(&pool) {}
  ~PageList() { clear(); }
  PageList(PageList&& other) noexcept;
  PageList& operator=(PageList&& other) noexcept;
  PageList(const PageList&) = delete;
  PageList& operator=(const PageList&) = delete;

  /// Makes room for `n_tokens` tokens in total (allocating pages as needed).
  void reserve(int n_tokens);
  kernels::PageId page_of(int token) const { return pages_[token / page_tokens()]; }
  int slot_of(int token) const { return token % page_tokens(); }
  int page_tokens() const { return pool_->layout().page_tokens; }
  const std::vector<kernels::PageId>& pages() const { return pages_; }
  /// Copies the first `n_pages` pages to host memory at `dst` (page_bytes each, consecutive) as one batched
  /// copy of the backend (one transfer), and waits for it. std::out_of_range past the last page.
  void download(size_t n_pages, std::byte* dst) const;
  /// The first n_pages pages as one host buffer.
  std::vector<std::byte> to_host(size_t n_pages) const;
  /// Fills the first `n_pages` pages from host memory at `src` (page_bytes each, consecutive) as one batched
  /// copy, and waits; reserve() the pages first (std::out_of_range past the last page).
  void upload(const std::byte* src, size_t n_pages);
  PagePool& pool() const { return *pool_; }
  void clear();

 private:
  std::span<const kernels::PageId> first(size_t n_pages) const;
  PagePool* pool_;
  std::vector<kernels::PageId> pages_;
};

}  // namespace choreo::kv
