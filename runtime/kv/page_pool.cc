#include "runtime/kv/page_pool.h"

#include <algorithm>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>

#include "common/error.h"
#include "common/memory_limits.h"

namespace choreo::kv {

PagePool::PagePool(kernels::Backend& backend, const kernels::KvLayout& layout, size_t budget_bytes)
    : backend_(backend), layout_(layout), budget_bytes_(budget_bytes) {
  layout_.check();
  // On a device, T0 is device memory: a budget the device cannot hold beside the weights would fail only
  // once the pages fill it, mid-run. Say so now.
  if (const std::optional<kernels::Backend::DeviceMemory> device = backend.device_memory();
      device && budget_bytes > device->free_bytes)
    throw InputError(
        fmt::format(
            "the KV cache budget (T0, --cache-mib) of {:.1f} MiB does not fit in the memory of the {} "
            "backend's device: {:.1f} MiB free beside the model's weights, of {:.1f} MiB",
            budget_bytes / 1048576.0, backend.name(), device->free_bytes / 1048576.0,
            device->total_bytes / 1048576.0),
        fmt::format("lower --cache-mib to at most {}, or use a device with more memory",
                    device->free_bytes >> 20));
  backend.set_kv_budget(budget_bytes);
  host_memory_ = !backend.device_memory();
}

size_t budget_within_device(const kernels::Backend& backend, size_t budget_bytes) {
  const std::optional<kernels::Backend::DeviceMemory> device = backend.device_memory();
  return device ? std::min(budget_bytes, device->free_bytes) : budget_bytes;
}

PagePool::~PagePool() = default;  // every page was released by its PageList

void PagePool::fit_budget_to_memory() {
  budget_bytes_ = bytes_in_use();
  memory_bounded_ = true;
}

kernels::PageId PagePool::allocate() {
  // Under an address-space limit (ulimit -v), host pages past what the limit leaves would fail the run part
  // way: once a page would leave less than the reserve (memory_limits.h), the pool is full at what it holds,
  // and the tiers evict as they do at any budget. Once (pages freed go back to malloc, not to the limit).
  if (host_memory_ && !memory_bounded_ && bytes_in_use() + page_bytes() <= budget_bytes_)
    if (const AddressSpaceLeft left = address_space_left();
        left.limited() && *left.least() < left.reserve_bytes + page_bytes())
      fit_budget_to_memory();
  while (bytes_in_use() + page_bytes() > budget_bytes_ && reclaimer_ && reclaimer_()) {
  }
  if (bytes_in_use() + page_bytes() > budget_bytes_) {
    if (memory_bounded_)
      throw OutOfMemory(
          fmt::format("the KV cache (T0) cannot grow past {:.1f} MiB: the memory limit (ulimit -v or -d) "
                      "leaves no more, and every page held is needed by the running calls: lower "
                      "--concurrency, shorten the context, or raise the limit",
                      budget_bytes_ / 1048576.0));
    throw InputError(fmt::format("KV cache budget of {:.1f} MiB exhausted ({} pages of {:.2f} MiB in use{})",
                                 budget_bytes_ / 1048576.0, in_use_, page_bytes() / 1048576.0,
                                 charged_ ? fmt::format(", {:.2f} MiB of E caches", charged_ / 1048576.0) : ""),
                     "raise the cache budget (--cache-mib) or shorten the context");
  }
  kernels::PageId page{};
  for (;;) {
    try {
      page = backend_.alloc_page(page_bytes());
      break;
    } catch (const std::bad_alloc&) {
      // Memory ran out below the budget (a limit the check above does not see): full at what it holds. The
      // page an eviction frees is reused by the next try.
      fit_budget_to_memory();
      if (!reclaimer_ || !reclaimer_()) return allocate();  // says why, as above
    }
  }
  ++in_use_;
  peak_bytes_ = std::max(peak_bytes_, bytes_in_use());
  return page;
}

bool PagePool::charge(size_t bytes) {
  if (bytes > budget_bytes_) return false;
  try {
    while (bytes_in_use() + bytes > budget_bytes_ && reclaimer_ && reclaimer_()) {
    }
  } catch (const InputError&) {
    return false;  // nothing can leave (the reclaimer's error is for pages the calls need; these are not)
  }
  if (bytes_in_use() + bytes > budget_bytes_) return false;
  charged_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, bytes_in_use());
  return true;
}

void PagePool::uncharge(size_t bytes) { charged_ -= std::min(bytes, charged_); }

void PagePool::release(kernels::PageId page) {
  backend_.free_page(page);
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

std::span<const kernels::PageId> PageList::first(size_t n_pages) const {
  if (n_pages > pages_.size())
    throw std::out_of_range(fmt::format("{} KV pages copied, of a list of {}", n_pages, pages_.size()));
  return std::span(pages_).first(n_pages);
}

void PageList::download(size_t n_pages, std::byte* dst) const {
  pool_->backend().copy_pages_to_host(first(n_pages), {0, pool_->page_bytes()}, dst).wait();
}

std::vector<std::byte> PageList::to_host(size_t n_pages) const {
  std::vector<std::byte> bytes(n_pages * pool_->page_bytes());
  download(n_pages, bytes.data());
  return bytes;
}

void PageList::upload(const std::byte* src, size_t n_pages) {
  pool_->backend().copy_pages_from_host(src, first(n_pages), {0, pool_->page_bytes()}).wait();
}

void PageList::clear() {
  for (kernels::PageId p : pages_) pool_->release(p);
  pages_.clear();
}

}  // namespace choreo::kv
