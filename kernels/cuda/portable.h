#pragma once
// The portability layer of choreo's CUDA kernels (issue 14): kernels are written once against this header and
// compile under nvcc (real CUDA) and under the host compiler (the block emulator, kernels/cuda/emu). It is
// deliberately small:
//   CHOREO_GLOBAL / CHOREO_DEVICE         __global__ / __device__ (nothing on the host)
//   cu::thread_idx() block_idx() block_dim() grid_dim()      threadIdx, blockIdx, blockDim, gridDim
//   cu::sync_threads(), cu::sync_warp()                        __syncthreads(), __syncwarp()
//   cu::shfl(v, lane), cu::shfl_xor(v, mask), cu::ballot(p)    full-warp shuffles and votes (32-bit values)
//   cu::warp_sum(v), cu::warp_max(v)                           the xor-butterfly reductions over the warp
//   cu::warp_values(v)[lane]                                   lane's v (a shuffle per read on the device)
//   CHOREO_SHARED_ARRAY(T, name, n)                            a static __shared__ array
//   cu::dynamic_shared<T>()                                    the launch's dynamic shared memory
//   cu::Ptr<T>, cu::make_ptr(p, n)                             global memory (bounds-checked when emulated)
//   cu::as_bytes(p)                                            the same memory as bytes (reinterpret_cast)
//   cu::Shared<T>                                              shared memory (checked and race-detected)
//   cu::atomic_add(Ptr<float>, i, v)                           atomicAdd
//   cu::bits_to_float(u)                                       __uint_as_float
//   cu::launch(name, kernel, grid, block, shared, stream, args...)   kernel<<<grid, block, shared, stream>>>
// Under nvcc `Ptr<T>` and `Shared<T>` are plain pointers; in the emulator they are checked views, so every
// out-of-bounds access and every shared-memory race of a kernel is an error naming it (block_emulator.h).
// Hardware-only features (tensor-core MMA, inline PTX) stay out of kernels written against this header; where
// a kernel uses one under nvcc, it keeps a portable fallback beside it, which is what the emulator runs.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define CHOREO_GLOBAL __global__
#define CHOREO_DEVICE __device__
#define CHOREO_HOST_DEVICE __host__ __device__
#define CHOREO_SHARED_ARRAY(T, name, n) __shared__ T name[n]
namespace choreo::cuda {
using Dim3 = dim3;  // launch geometry; the emulator defines its own (emu/block_emulator.h)
}
#else
#include <fmt/format.h>

#include <cmath>

#include "kernels/cuda/emu/block_emulator.h"
// Kernels are defined in headers: on the host they are inline functions (device functions say `inline`).
#define CHOREO_GLOBAL inline
#define CHOREO_DEVICE
#define CHOREO_HOST_DEVICE
#define CHOREO_SHARED_ARRAY(T, name, n) \
  ::choreo::cuda::cu::Shared<T> name(    \
      static_cast<T*>(::choreo::cuda::emu::static_shared(__FILE__ ":" CHOREO_STRINGIFY(__LINE__) #name, sizeof(T) * (n))), (n))
#define CHOREO_STRINGIFY_(x) #x
#define CHOREO_STRINGIFY(x) CHOREO_STRINGIFY_(x)
#endif

namespace choreo::cuda::cu {

#if defined(__CUDACC__)

template <class T>
using Ptr = T*;
template <class T>
using Shared = T*;
using Stream = cudaStream_t;

template <class T>
inline T* make_ptr(T* p, size_t) {
  return p;
}
__host__ __device__ inline uint8_t* as_bytes(float* p) { return reinterpret_cast<uint8_t*>(p); }
__host__ __device__ inline const uint8_t* as_bytes(const float* p) { return reinterpret_cast<const uint8_t*>(p); }
__host__ __device__ inline float bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}
__device__ inline uint3 thread_idx() { return threadIdx; }
__device__ inline uint3 block_idx() { return blockIdx; }
__device__ inline dim3 block_dim() { return blockDim; }
__device__ inline dim3 grid_dim() { return gridDim; }
__device__ inline void sync_threads() { __syncthreads(); }
__device__ inline void sync_warp() { __syncwarp(); }
__device__ inline float shfl(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
__device__ inline float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ inline int shfl(int v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
__device__ inline int shfl_xor(int v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ inline uint32_t ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
/// v summed over the warp by the xor butterfly: at step m (16, 8, 4, 2, 1) lane i adds lane i^m's value to its
/// own. Every lane ends with the same bits (a + b == b + a exactly).
__device__ inline float warp_sum(float v) {
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
/// The warp's maximum by the same butterfly (other > v ? other : v).
__device__ inline float warp_max(float v) {
  for (int m = 16; m > 0; m /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, m);
    v = other > v ? other : v;
  }
  return v;
}
/// Every lane's value of v: values[t] is lane t's (a shuffle per read, which every lane must make together).
template <class T>
struct WarpValues {
  T v;
  __device__ T operator[](int lane) const { return __shfl_sync(0xffffffffu, v, lane); }
};
template <class T>
__device__ inline WarpValues<T> warp_values(T v) {
  return {v};
}
__device__ inline unsigned lane_id() {
  return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
}
template <class T>
__device__ inline T* dynamic_shared() {
  extern __shared__ unsigned char choreo_dynamic_shared[];
  return reinterpret_cast<T*>(choreo_dynamic_shared);
}
__device__ inline float atomic_add(float* p, size_t i, float v) { return atomicAdd(p + i, v); }

template <class... Params, class... Args>
inline void launch(const char*, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, Stream stream,
                   Args&&... args) {
  kernel<<<grid, block, shared, stream>>>(static_cast<Params>(args)...);
}

#else  // the block emulator

using Stream = void*;

/// Global memory: a pointer with its allocation's extent; every access is checked.
template <class T>
class Ptr {
 public:
  Ptr() = default;
  Ptr(T* base, size_t n, ptrdiff_t offset = 0) : base_(base), n_(n), offset_(offset) {}
  template <class U>
  Ptr(const Ptr<U>& o) : base_(o.base()), n_(o.extent()), offset_(o.offset()) {}  // T* from U*, e.g. to const
  T& operator[](ptrdiff_t i) const {
    const ptrdiff_t at = offset_ + i;
    if (!base_ || at < 0 || size_t(at) >= n_)
      emu::fail(fmt::format("out-of-bounds global memory access: element {} of an allocation of {} elements", at, n_));
    return base_[at];
  }
  T& operator*() const { return (*this)[0]; }
  Ptr operator+(ptrdiff_t k) const { return Ptr(base_, n_, offset_ + k); }
  Ptr operator-(ptrdiff_t k) const { return Ptr(base_, n_, offset_ - k); }
  T* base() const { return base_; }
  size_t extent() const { return n_; }
  ptrdiff_t offset() const { return offset_; }

 private:
  T* base_ = nullptr;
  size_t n_ = 0;
  ptrdiff_t offset_ = 0;
};

template <class T>
inline Ptr<T> make_ptr(T* p, size_t n) {
  return Ptr<T>(p, n);
}
/// The same allocation as bytes, the extent and offset scaled.
inline Ptr<uint8_t> as_bytes(Ptr<float> p) {
  return Ptr<uint8_t>(reinterpret_cast<uint8_t*>(p.base()), p.extent() * 4, p.offset() * 4);
}
inline Ptr<const uint8_t> as_bytes(Ptr<const float> p) {
  return Ptr<const uint8_t>(reinterpret_cast<const uint8_t*>(p.base()), p.extent() * 4, p.offset() * 4);
}
inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

/// Shared memory: bounds-checked, and every element access is reported to the race detector.
template <class T>
class Shared {
 public:
  class Ref {
   public:
    explicit Ref(T* p) : p_(p) {}
    operator T() const {
      emu::shared_access(p_, sizeof(T), false);
      T v;
      std::memcpy(&v, p_, sizeof(T));
      return v;
    }
    Ref& operator=(T v) {
      emu::shared_access(p_, sizeof(T), true);
      std::memcpy(p_, &v, sizeof(T));
      return *this;
    }
    Ref& operator=(const Ref& o) { return *this = T(o); }
    Ref& operator+=(T v) { return *this = T(*this) + v; }
    Ref& operator*=(T v) { return *this = T(*this) * v; }

   private:
    T* p_;
  };
  Shared(T* p, size_t n) : p_(p), n_(n) {}
  Ref operator[](ptrdiff_t i) const {
    if (i < 0 || size_t(i) >= n_)
      emu::fail(fmt::format("out-of-bounds shared memory access: element {} of a shared array of {}", i, n_));
    return Ref(p_ + i);
  }
  size_t size() const { return n_; }

 private:
  T* p_;
  size_t n_;
};

inline Dim3 thread_idx() { return emu::thread_idx(); }
inline Dim3 block_idx() { return emu::block_idx(); }
inline Dim3 block_dim() { return emu::block_dim(); }
inline Dim3 grid_dim() { return emu::grid_dim(); }
inline void sync_threads() { emu::sync_threads(); }
inline void sync_warp() { emu::sync_warp(); }
inline unsigned lane_id() {
  const Dim3 t = thread_idx(), d = block_dim();
  return (t.x + d.x * (t.y + d.y * t.z)) % kWarpSize;
}
template <class T>
inline T shfl(T v, int lane) {
  static_assert(sizeof(T) == 4, "shuffles move 32-bit values");
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = emu::shuffle(bits, lane);
  std::memcpy(&v, &bits, 4);
  return v;
}
template <class T>
inline T shfl_xor(T v, int mask) {
  return shfl(v, int(lane_id()) ^ mask);
}
inline uint32_t ballot(bool p) { return emu::ballot(p); }
/// Every lane's value of v, after one warp exchange; reading lane t is then local (on the device, a shuffle).
template <class T>
class WarpValues {
 public:
  explicit WarpValues(T v) {
    static_assert(sizeof(T) == 4, "shuffles move 32-bit values");
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits_ = emu::gather(bits, &live_);
  }
  T operator[](int lane) const {
    if (lane < 0 || unsigned(lane) >= live_)
      emu::fail(fmt::format("shuffle from lane {}, which does not exist in this warp ({} live lanes)", lane, live_));
    T v;
    std::memcpy(&v, &bits_[size_t(lane)], 4);
    return v;
  }

 private:
  std::array<uint32_t, kWarpSize> bits_;
  unsigned live_ = 0;
};
template <class T>
inline WarpValues<T> warp_values(T v) {
  return WarpValues<T>(v);
}
/// The xor butterfly of the device's warp_sum / warp_max, computed from one exchange: the same additions (or
/// comparisons) in the same order as five shuffles, with a fifth of the emulator's thread switches. Only the
/// values this lane's result depends on are computed: after step m, those of the lanes j with j ^ lane < m.
template <class Op>
inline float warp_butterfly(float v, Op op) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  unsigned live = 0;
  const std::array<uint32_t, kWarpSize> all = emu::gather(bits, &live);
  if (live < unsigned(kWarpSize))
    emu::fail(fmt::format("a warp reduction (xor shuffles) over a partial warp of {} live lanes", live));
  std::array<float, kWarpSize> a;
  std::memcpy(a.data(), all.data(), sizeof(a));
  const int lane = int(lane_id());
  for (int m = 16; m > 0; m /= 2)
    for (int x = 0; x < m; ++x) {  // in place: lane j reads j ^ m, which is outside the set this step writes
      const int j = lane ^ x;
      a[size_t(j)] = op(a[size_t(j)], a[size_t(j ^ m)]);
    }
  return a[size_t(lane)];
}
inline float warp_sum(float v) {
  return warp_butterfly(v, [](float mine, float other) { return mine + other; });
}
inline float warp_max(float v) {
  return warp_butterfly(v, [](float mine, float other) { return other > mine ? other : mine; });
}
template <class T>
inline Shared<T> dynamic_shared() {
  size_t bytes = 0;
  void* p = emu::dynamic_shared(&bytes);
  return Shared<T>(static_cast<T*>(p), bytes / sizeof(T));
}
inline float atomic_add(Ptr<float> p, size_t i, float v) {  // one emulated thread runs at a time
  float& x = p[ptrdiff_t(i)];
  const float old = x;
  x = old + v;
  return old;
}

template <class... Params, class... Args>
inline void launch(const char* name, void (*kernel)(Params...), Dim3 grid, Dim3 block, size_t shared, Stream,
                   Args&&... args) {
  emu::launch({name, grid, block, shared}, [&] { kernel(static_cast<Params>(args)...); });
}

#endif

}  // namespace choreo::cuda::cu
