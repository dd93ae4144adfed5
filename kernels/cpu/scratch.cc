#include "kernels/cpu/scratch.h"

#include <new>

namespace choreo::kernels::cpu {

std::byte* ScratchBuffer::reserve(size_t bytes) {
  if (bytes > capacity_bytes_ || !data_) {
    const size_t rounded = (bytes + 63) / 64 * 64 + 64;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, rounded)));
    if (!data_) throw std::bad_alloc();
    capacity_bytes_ = rounded;
  }
  return data_.get();
}

ScratchBuffer& thread_scratch(ScratchSlot slot) {
  thread_local ScratchBuffer buffers[2];
  return buffers[static_cast<int>(slot)];
}

}  // namespace choreo::kernels::cpu
