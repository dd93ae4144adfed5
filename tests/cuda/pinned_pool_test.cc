// The pinned host memory pool of the CUDA backend (kernels/cuda/pinned_pool.h), with an allocator that counts
// what the device would pin: few pinned allocations for many requests, ranges that never overlap, released
// ranges merged and reused, wholly free chunks given back but one, and memory the pool did not hand out
// refused.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/pinned_pool.h"

namespace choreo::cuda {
namespace {

/// What the device was asked to pin: live allocations and how many were ever made.
struct CountingDevice {
  std::map<void*, size_t> live;
  int made = 0;
};

TEST_CASE("pinned pool: many ranges from few pinned chunks, never overlapping, merged and reused when released") {
  CountingDevice device;
  {
    PinnedPool pool(
        [&](size_t bytes) {
          void* p = ::operator new(bytes, std::align_val_t(64));
          device.live[p] = bytes;
          ++device.made;
          return p;
        },
        [&](void* p) {
          REQUIRE(device.live.erase(p) == 1);
          ::operator delete(p, std::align_val_t(64));
        },
        size_t(1) << 20);
    std::mt19937 rng(7);
    struct Range {
      uint8_t* p;
      size_t bytes;
      uint8_t fill;
    };
    std::vector<Range> held;
    // 2000 requests of 1 byte to 40 KiB, about half released again along the way, each range filled with its
    // own byte: a range that overlapped another would find its bytes changed.
    for (int i = 0; i < 2000; ++i) {
      if (!held.empty() && rng() % 2) {
        const size_t at = rng() % held.size();
        const Range r = held[at];
        CHECK(std::all_of(r.p, r.p + r.bytes, [&](uint8_t b) { return b == r.fill; }));
        pool.release(r.p);
        held.erase(held.begin() + long(at));
      }
      const size_t bytes = 1 + rng() % (40 << 10);
      auto* p = static_cast<uint8_t*>(pool.alloc(bytes));
      CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
      const uint8_t fill = uint8_t(i);
      std::memset(p, fill, bytes);
      held.push_back({p, bytes, fill});
    }
    for (const Range& r : held) CHECK(std::all_of(r.p, r.p + r.bytes, [&](uint8_t b) { return b == r.fill; }));
    size_t live_bytes = 0;
    for (const Range& r : held) live_bytes += r.bytes;
    MESSAGE(held.size(), " ranges (", live_bytes >> 10, " KiB) in ", pool.chunks(), " chunks of 1 MiB; ", device.made,
            " pinned allocations for 2000 requests");
    CHECK(device.made < 100);
    CHECK(pool.pinned_bytes() < 4 * live_bytes + (size_t(2) << 20));
    // Everything released: one idle chunk is kept, the rest given back.
    for (const Range& r : held) pool.release(r.p);
    CHECK(pool.chunks() == 1);
    CHECK(device.live.size() == 1);
    // Released neighbours merge: three ranges freed, then one of their total size lands where the first was.
    void* a = pool.alloc(1000);
    void* b = pool.alloc(3000);
    void* c = pool.alloc(5000);
    pool.release(b);
    pool.release(a);
    pool.release(c);
    CHECK(pool.alloc(1024 + 3008 + 5056) == a);
    // A request larger than a chunk gets a chunk of its own.
    const int before = device.made;
    void* big = pool.alloc(size_t(3) << 20);
    CHECK(device.made == before + 1);
    pool.release(big);
    // owns: exactly the bytes of ranges handed out and not taken back.
    void* d = pool.alloc(1000);  // 1024 bytes, rounded up
    CHECK(pool.owns(d, 1000));
    CHECK(pool.owns(static_cast<uint8_t*>(d) + 24, 1000));
    CHECK_FALSE(pool.owns(static_cast<uint8_t*>(d) + 25, 1000));  // past the range's end
    pool.release(d);
    CHECK_FALSE(pool.owns(d, 1));
    // What the pool did not hand out is refused.
    int outside = 0;
    CHECK_FALSE(pool.owns(&outside, sizeof outside));
    CHECK_THROWS_AS(pool.release(&outside), std::logic_error);
    CHECK_THROWS_AS(pool.release(static_cast<uint8_t*>(a) + 64), std::logic_error);
  }
  CHECK(device.live.empty());  // the pool gives back every chunk when it goes
}

}  // namespace
}  // namespace choreo::cuda
