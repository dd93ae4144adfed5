// The KV page pool under an address-space limit (ulimit -v; runtime/kv/page_pool.h, common/memory_limits.h):
// host pages stop short of what the limit leaves, keeping the reserve free, instead of failing with
// std::bad_alloc part way (issue 42, finding 6). The limit is lowered in this process for a moment, around
// nothing but the pool's own allocations, and put back.

#include <doctest/doctest.h>
#include <sys/resource.h>

#include <memory>
#include <vector>

#include "common/error.h"
#include "common/memory_limits.h"
#include "kernels/backend.h"
#include "runtime/kv/page_pool.h"

namespace choreo::kv {
namespace {

/// RLIMIT_AS lowered to what is in use now plus `headroom_bytes` while it lives.
class AddressLimitScope {
 public:
  explicit AddressLimitScope(uint64_t headroom_bytes) {
    REQUIRE(::getrlimit(RLIMIT_AS, &saved_) == 0);
    const uint64_t used = uint64_t(proc_status_field("VmSize").value_or(0)) * 1024;
    REQUIRE(used > 0);
    rlimit lowered = saved_;
    lowered.rlim_cur = used + headroom_bytes;
    if (saved_.rlim_max != RLIM_INFINITY)
      lowered.rlim_cur = std::min<rlim_t>(lowered.rlim_cur, saved_.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_AS, &lowered) == 0);
  }
  ~AddressLimitScope() { ::setrlimit(RLIMIT_AS, &saved_); }
  AddressLimitScope(const AddressLimitScope&) = delete;
  AddressLimitScope& operator=(const AddressLimitScope&) = delete;

 private:
  rlimit saved_{};
};

}  // namespace

TEST_CASE(
    "KV pool under an address-space limit: full at what the limit leaves, OutOfMemory when none can go") {
  const std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  // 1 MiB pages, and a budget no limit here reaches: only the address space stops the pool.
  PagePool pool(*backend, kernels::KvLayout{32, 16, 4, 64, kernels::DType::F32, kernels::DType::F32},
                size_t(1) << 40);
  REQUIRE(pool.page_bytes() == size_t(1) << 20);
  std::vector<kernels::PageId> pages;
  {
    // 64 MiB past the reserve (at most 512 MiB).
    AddressLimitScope limit(kAddressSpaceReserveBytes + (uint64_t(64) << 20));
    const AddressSpaceLeft left = address_space_left();
    REQUIRE(left.address_bytes);
    REQUIRE(*left.address_bytes > left.reserve_bytes);
    const uint64_t room_bytes = *left.address_bytes - left.reserve_bytes;
    bool out_of_memory = false;
    try {
      for (;;) pages.push_back(pool.allocate());
    } catch (const OutOfMemory& e) {
      out_of_memory = std::string(e.what()).find("ulimit -v") != std::string::npos;
    }
    CHECK(out_of_memory);
    // Full at what it holds: most of the room above the reserve (other mappings take a little; memory malloc
    // had freed before is reused without taking more), and the reserve is left.
    CHECK(pages.size() >= room_bytes / pool.page_bytes() / 2);
    CHECK(*address_space_left().address_bytes + pool.page_bytes() >= left.reserve_bytes);
    CHECK(pool.budget_bytes() == pool.bytes_in_use());
    // At that budget the pool goes on as at any: a page freed by the reclaimer makes room for the next.
    pool.set_reclaimer([&] {
      if (pages.empty()) return false;
      pool.release(pages.back());
      pages.pop_back();
      return true;
    });
    const size_t held = pages.size();
    for (int i = 0; i < 8; ++i) pages.push_back(pool.allocate());
    CHECK(pages.size() == held);
  }
  pool.set_reclaimer(nullptr);
  for (kernels::PageId page : pages) pool.release(page);
}

}  // namespace choreo::kv
