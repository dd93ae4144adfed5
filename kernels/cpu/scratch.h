#pragma once
// Per-thread working memory for the CPU kernels.

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace choreo::kernels::cpu {

/// Grow-only, 64-byte-aligned memory that one thread reuses across calls, so that matrix products stop
/// allocating once warmed up (the hot loop of a forward pass allocates nothing).
class ScratchBuffer {
 public:
  /// At least `bytes` bytes, 64-byte aligned; contents are unspecified. Invalidates earlier pointers.
  std::byte* reserve(size_t bytes);

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t capacity_bytes_ = 0;
};

/// Which of a thread's scratch buffers a kernel uses; distinct users must not share one.
enum class ScratchSlot { Activations = 0, Panels = 1 };

/// The calling thread's buffer for `slot`.
ScratchBuffer& thread_scratch(ScratchSlot slot);

}  // namespace choreo::kernels::cpu
