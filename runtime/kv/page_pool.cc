#include "runtime/kv/page_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.h"

namespace choreo::kv {

PagePool::PagePool(const kernels::KvLayout& layout, size_t budget_bytes)
    : layout_(layout), budget_bytes_(budget_bytes) {}

PagePool::~PagePool() {
  for (float* p : all_) std::free(p);
}

float* PagePool::allocate() {
  float* page = nullptr;
  while (free_.empty() && (all_.size() + 1) * page_bytes() > budget_bytes_ && reclaimer_ && reclaimer_()) {
  }
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
  } else {
    if ((all_.size() + 1) * page_bytes() > budget_bytes_) {
      throw InputError(fmt::format("KV cache budget of {:.1f} MiB exhausted ({} pages of {:.2f} MiB in use)",
                                   budget_bytes_ / 1048576.0, in_use_, page_bytes() / 1048576.0),
                       "raise the cache budget (--cache-mib) or shorten the context");
    }
    size_t bytes = (page_bytes() + 63) / 64 * 64;
    page = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!page) throw std::bad_alloc();
    all_.push_back(page);
  }
  std::memset(page, 0, page_bytes());
  ++in_use_;
  peak_in_use_ = std::max(peak_in_use_, in_use_);
  return page;
}

void PagePool::release(float* page) {
  free_.push_back(page);
  --in_use_;
}

PageList::PageList(PageList&& other) noexcept : pool_(other.pool_), pages_(std::move(other.pages_)) {
  other.pages_.clear();
}

PageList& PageList::operator=(PageList&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = other.pool_;
    pages_ = std::move(other.pages_);
    other.pages_.clear();
  }
  return *this;
}

void PageList::reserve(int n_tokens) {
  const size_t need = pool_->layout().pages_for(size_t(n_tokens));
  while (pages_.size() < need) pages_.push_back(pool_->allocate());
}

void PageList::clear() {
  for (float* p : pages_) pool_->release(p);
  pages_.clear();
}

}  // namespace choreo::kv
