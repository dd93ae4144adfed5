// The CUDA block emulator tested on its own (issue 14, kernels/cuda/emu): kernels written against
// kernels/cuda/portable.h run on the CPU with CUDA's semantics, give the results a plain host loop gives, and
// every bug class the emulator promises to catch is caught: a shared-memory race, a missing __syncthreads, an
// out-of-bounds global or shared access, a divergent barrier, a shuffle with a lane that does not exist, and a
// launch configuration CUDA would refuse. Launch geometry: partial warps, multi-dimensional blocks, and more
// than 65,535 blocks.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/portable.h"
#include "tests/cuda/random_values.h"

namespace choreo::cuda {
namespace {

using cu::Ptr;

// ---- kernels -------------------------------------------------------------------------------------------

/// out[block] = the sum of x over the block's slice: a shared-memory tree reduction (blockDim.x a power of 2).
CHOREO_GLOBAL void block_sum(Ptr<const float> x, int n, Ptr<float> out, bool skip_barrier) {
  CHOREO_SHARED_ARRAY(float, partial, 256);
  const unsigned t = cu::thread_idx().x, b = cu::block_idx().x, width = cu::block_dim().x;
  const unsigned i = b * width + t;
  partial[t] = i < unsigned(n) ? x[i] : 0.0f;
  if (!skip_barrier) cu::sync_threads();
  for (unsigned stride = width / 2; stride > 0; stride /= 2) {
    if (t < stride) partial[t] = partial[t] + partial[t + stride];
    if (!skip_barrier) cu::sync_threads();
  }
  if (t == 0) out[b] = partial[0];
}

/// out[warp] = the sum of x over each warp's 32 values, by shuffles alone.
CHOREO_GLOBAL void warp_sum(Ptr<const float> x, Ptr<float> out) {
  const unsigned i = cu::block_idx().x * cu::block_dim().x + cu::thread_idx().x;
  float v = x[i];
  for (int mask = 16; mask > 0; mask /= 2) v += cu::shfl_xor(v, mask);
  if (cu::lane_id() == 0) out[i / 32] = v;
}

/// Each lane's warp_sum, warp_max and the value warp_values gives for lane (lane + 5) % 32, next to the same
/// computed with explicit shuffles (the device's definitions of the helpers): out[i] holds 6 values per lane.
CHOREO_GLOBAL void warp_helpers(Ptr<const float> x, Ptr<float> out) {
  const unsigned i = cu::block_idx().x * cu::block_dim().x + cu::thread_idx().x;
  const float v = x[i];
  float sum = v, max = v;
  for (int mask = 16; mask > 0; mask /= 2) {
    sum += cu::shfl_xor(sum, mask);
    const float other = cu::shfl_xor(max, mask);
    max = other > max ? other : max;
  }
  const int from = int((cu::lane_id() + 5) % 32);
  out[6 * i] = cu::warp_sum(v);
  out[6 * i + 1] = sum;
  out[6 * i + 2] = cu::warp_max(v);
  out[6 * i + 3] = max;
  out[6 * i + 4] = cu::warp_values(v)[from];
  out[6 * i + 5] = cu::shfl(v, from);
}

/// Every thread adds one to the same shared word without atomics: a race.
CHOREO_GLOBAL void racy_counter(Ptr<int> out) {
  CHOREO_SHARED_ARRAY(int, counter, 1);
  if (cu::thread_idx().x == 0) counter[0] = 0;
  cu::sync_threads();
  counter[0] += 1;
  cu::sync_threads();
  if (cu::thread_idx().x == 0) out[0] = counter[0];
}

/// Reads one element past the end of x.
CHOREO_GLOBAL void read_past_end(Ptr<const float> x, int n, Ptr<float> out) {
  const unsigned t = cu::thread_idx().x;
  out[t] = x[t + 1 < unsigned(n) ? t + 1 : unsigned(n)];
}

/// Indexes a shared array of 32 with 33 threads.
CHOREO_GLOBAL void shared_past_end(Ptr<float> out) {
  CHOREO_SHARED_ARRAY(float, s, 32);
  const unsigned t = cu::thread_idx().x;
  s[t] = float(t);
  cu::sync_threads();
  out[t] = s[t];
}

/// Threads of the upper half leave before a barrier the others wait at.
CHOREO_GLOBAL void early_exit(Ptr<float> out) {
  const unsigned t = cu::thread_idx().x;
  if (t >= cu::block_dim().x / 2) return;
  cu::sync_threads();
  out[t] = 1.0f;
}

/// out[i] = the ballot of "lane is odd" of each lane's warp, and each value rotated by one lane.
CHOREO_GLOBAL void votes(Ptr<uint32_t> ballots, Ptr<float> rotated) {
  const unsigned i = cu::thread_idx().x, lane = cu::lane_id();
  ballots[i] = cu::ballot(lane % 2 == 1);
  rotated[i] = cu::shfl(float(i), int((lane + 1) % 32));
}

/// Every thread of a 3-D block over a 2-D grid writes its global linear index into its own slot.
CHOREO_GLOBAL void coordinates(Ptr<uint32_t> out) {
  const Dim3 t = cu::thread_idx(), d = cu::block_dim(), b = cu::block_idx(), g = cu::grid_dim();
  const uint32_t block = b.x + g.x * b.y;
  const uint32_t thread = t.x + d.x * (t.y + d.y * t.z);
  out[block * uint32_t(d.count()) + thread] = block * 1000u + thread;
}

/// out[block] = block index: a one-thread-per-block kernel for large grids.
CHOREO_GLOBAL void block_ids(Ptr<uint32_t> out) { out[cu::block_idx().x] = cu::block_idx().x; }

/// A shuffle reading lane 20 of a warp that has 16 lanes.
CHOREO_GLOBAL void shuffle_missing_lane(Ptr<float> out) {
  out[cu::thread_idx().x] = cu::shfl(1.0f, 20);
}

/// The dynamic shared memory, reversed through it.
CHOREO_GLOBAL void reverse(Ptr<const float> x, Ptr<float> out) {
  cu::Shared<float> s = cu::dynamic_shared<float>();
  const unsigned t = cu::thread_idx().x, n = cu::block_dim().x;
  s[t] = x[t];
  cu::sync_threads();
  out[t] = s[n - 1 - t];
}

// ---- helpers -------------------------------------------------------------------------------------------

using testing::random_values;

/// The EmulationError a launch throws (empty when it throws none).
template <class F>
std::string error_of(F&& run) {
  try {
    run();
  } catch (const emu::EmulationError& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- tests ---------------------------------------------------------------------------------------------

TEST_CASE("cuda emulator: a shared-memory tree reduction gives each block's sum") {
  const int n = 1000, width = 256, blocks = (n + width - 1) / width;
  const std::vector<float> x = random_values(n, 1);
  std::vector<float> out(blocks, -1.0f);
  cu::launch("block_sum", block_sum, Dim3(blocks), Dim3(width), 0, nullptr, cu::make_ptr(x.data(), x.size()), n,
             cu::make_ptr(out.data(), out.size()), false);
  for (int b = 0; b < blocks; ++b) {
    double sum = 0;
    for (int i = b * width; i < std::min(n, (b + 1) * width); ++i) sum += x[size_t(i)];
    CHECK(out[size_t(b)] == doctest::Approx(sum).epsilon(1e-5));
  }
}

TEST_CASE("cuda emulator: a missing __syncthreads is a shared-memory race") {
  const std::vector<float> x = random_values(256, 2);
  std::vector<float> out(1);
  const std::string err = error_of([&] {
    cu::launch("block_sum", block_sum, Dim3(1), Dim3(256), 0, nullptr, cu::make_ptr(x.data(), x.size()), 256,
               cu::make_ptr(out.data(), out.size()), true);
  });
  INFO(err);
  CHECK(contains(err, "shared-memory race"));
  CHECK(contains(err, "kernel block_sum, block (0, 0, 0), thread"));
}

TEST_CASE("cuda emulator: unsynchronised updates of one shared word are a race") {
  std::vector<int> out(1);
  const std::string err = error_of(
      [&] { cu::launch("racy_counter", racy_counter, Dim3(1), Dim3(64), 0, nullptr, cu::make_ptr(out.data(), 1)); });
  INFO(err);
  CHECK(contains(err, "shared-memory race"));
  // One thread alone is no race, and the counter counts it.
  CHECK(error_of([&] {
          cu::launch("racy_counter", racy_counter, Dim3(1), Dim3(1), 0, nullptr, cu::make_ptr(out.data(), 1));
        }) == "");
  CHECK(out[0] == 1);
}

TEST_CASE("cuda emulator: out-of-bounds global and shared accesses are caught") {
  const std::vector<float> x = random_values(32, 3);
  std::vector<float> out(64);
  const std::string global = error_of([&] {
    cu::launch("read_past_end", read_past_end, Dim3(1), Dim3(32), 0, nullptr, cu::make_ptr(x.data(), x.size()), 32,
               cu::make_ptr(out.data(), out.size()));
  });
  INFO(global);
  CHECK(contains(global, "out-of-bounds global memory access: element 32 of an allocation of 32"));
  CHECK(contains(global, "thread (31, 0, 0)"));
  const std::string shared = error_of([&] {
    cu::launch("shared_past_end", shared_past_end, Dim3(1), Dim3(33), 0, nullptr, cu::make_ptr(out.data(), out.size()));
  });
  INFO(shared);
  CHECK(contains(shared, "out-of-bounds shared memory access: element 32 of a shared array of 32"));
}

TEST_CASE("cuda emulator: a barrier some threads never reach is an error, not a hang") {
  std::vector<float> out(64);
  const std::string err = error_of([&] {
    cu::launch("early_exit", early_exit, Dim3(1), Dim3(64), 0, nullptr, cu::make_ptr(out.data(), out.size()));
  });
  INFO(err);
  CHECK(contains(err, "__syncthreads() is divergent"));
}

TEST_CASE("cuda emulator: warp shuffles and ballots, including a partial last warp") {
  SUBCASE("shuffle reduction over full warps") {
    const std::vector<float> x = random_values(256, 4);
    std::vector<float> out(8);
    cu::launch("warp_sum", warp_sum, Dim3(2), Dim3(128), 0, nullptr, cu::make_ptr(x.data(), x.size()),
               cu::make_ptr(out.data(), out.size()));
    for (int w = 0; w < 8; ++w) {
      double sum = 0;
      for (int i = 0; i < 32; ++i) sum += x[size_t(w * 32 + i)];
      CHECK(out[size_t(w)] == doctest::Approx(sum).epsilon(1e-5));
    }
  }
  SUBCASE("warp_sum, warp_max and warp_values give the bits of the explicit shuffles") {
    const std::vector<float> x = random_values(128, 9, 100.0f);
    std::vector<float> out(6 * 128);
    cu::launch("warp_helpers", warp_helpers, Dim3(2), Dim3(64), 0, nullptr, cu::make_ptr(x.data(), x.size()),
               cu::make_ptr(out.data(), out.size()));
    for (size_t i = 0; i < 128; ++i) {
      CAPTURE(i);
      CHECK(std::memcmp(&out[6 * i], &out[6 * i + 1], 4) == 0);
      CHECK(std::memcmp(&out[6 * i + 2], &out[6 * i + 3], 4) == 0);
      CHECK(out[6 * i + 4] == x[i / 32 * 32 + (i % 32 + 5) % 32]);
      CHECK(std::memcmp(&out[6 * i + 4], &out[6 * i + 5], 4) == 0);
    }
    double sum = 0;
    for (size_t i = 0; i < 32; ++i) sum += x[i];
    CHECK(out[0] == doctest::Approx(sum).epsilon(1e-5));
    CHECK(out[2] == *std::max_element(x.begin(), x.begin() + 32));
  }
  SUBCASE("ballots and rotations") {
    std::vector<uint32_t> ballots(64);
    std::vector<float> rotated(64);
    cu::launch("votes", votes, Dim3(1), Dim3(64), 0, nullptr, cu::make_ptr(ballots.data(), 64),
               cu::make_ptr(rotated.data(), 64));
    for (unsigned i = 0; i < 64; ++i) {
      CHECK(ballots[i] == 0xaaaaaaaau);
      CHECK(rotated[i] == float((i / 32) * 32 + (i % 32 + 1) % 32));
    }
  }
  SUBCASE("a shuffle from a lane the partial warp lacks") {
    std::vector<float> out(48);
    const std::string err = error_of([&] {
      cu::launch("shuffle_missing_lane", shuffle_missing_lane, Dim3(1), Dim3(48), 0, nullptr,
                 cu::make_ptr(out.data(), out.size()));
    });
    INFO(err);
    CHECK(contains(err, "shuffle from lane 20, which does not exist in this warp (16 live lanes)"));
  }
}

TEST_CASE("cuda emulator: launch geometry: 3-D blocks over a 2-D grid, more than 65,535 blocks, dynamic shared memory") {
  SUBCASE("every thread of every block, once") {
    const Dim3 grid(3, 2), block(5, 3, 2);
    std::vector<uint32_t> out(grid.count() * block.count(), ~0u);
    cu::launch("coordinates", coordinates, grid, block, 0, nullptr, cu::make_ptr(out.data(), out.size()));
    for (uint32_t b = 0; b < grid.count(); ++b)
      for (uint32_t t = 0; t < block.count(); ++t) CHECK(out[b * block.count() + t] == b * 1000 + t);
  }
  SUBCASE("70,000 one-thread blocks") {
    std::vector<uint32_t> out(70000, ~0u);
    cu::launch("block_ids", block_ids, Dim3(70000), Dim3(1), 0, nullptr, cu::make_ptr(out.data(), out.size()));
    std::vector<uint32_t> expected(out.size());
    std::iota(expected.begin(), expected.end(), 0u);
    CHECK(out == expected);
  }
  SUBCASE("dynamic shared memory") {
    const std::vector<float> x = random_values(96, 5);
    std::vector<float> out(96);
    cu::launch("reverse", reverse, Dim3(1), Dim3(96), 96 * sizeof(float), nullptr, cu::make_ptr(x.data(), x.size()),
               cu::make_ptr(out.data(), out.size()));
    for (size_t i = 0; i < 96; ++i) CHECK(out[i] == x[95 - i]);
  }
}

TEST_CASE("cuda emulator: configurations CUDA refuses are refused") {
  std::vector<uint32_t> out(1);
  const auto run = [&](Dim3 grid, Dim3 block, size_t shared) {
    return error_of([&] { cu::launch("block_ids", block_ids, grid, block, shared, nullptr, cu::make_ptr(out.data(), 1)); });
  };
  CHECK(contains(run(Dim3(1), Dim3(1025), 0), "more than 1024 threads per block"));
  CHECK(contains(run(Dim3(1), Dim3(1, 1, 65), 0), "block dimension"));
  CHECK(contains(run(Dim3(1, 65536), Dim3(1), 0), "grid dimension"));
  CHECK(contains(run(Dim3(1), Dim3(1), 228 * 1024), "dynamic shared memory"));
  CHECK(contains(run(Dim3(0), Dim3(1), 0), "empty grid"));
}

}  // namespace
}  // namespace choreo::cuda
