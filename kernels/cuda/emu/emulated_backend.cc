// The CUDA backend on the CPU (issue 14): kernels/cuda/backend_core.h's host logic with an emulated device.
// Every operation launches the kernel source of kernels/cuda/kernels/*.cuh through the block emulator, so a
// whole model, the engine and the conformance tests run on choreo's CUDA backend with no GPU; every launch is
// checked for out-of-bounds accesses, shared-memory races and divergent barriers.
//
// The emulated device's memory is host memory that it keeps a record of. Every array an operation reads or
// writes must lie in one of its allocations: a host pointer handed to an operation is an error, as it would be
// on a GPU, so the model code's use of backend memory (weights uploaded, activations in Buffers, metadata
// staged) is checked here. Copies are done when they return; the emulator runs every block on the calling
// thread, so there is nothing to synchronise.

#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include <fmt/format.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend_core.h"

namespace choreo::kernels {

namespace {

class EmulatedDevice {
 public:
  std::string name() const { return "cuda-emulated"; }

  void* alloc(size_t bytes) {
    std::lock_guard lock(mutex_);
    void* p = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64));
    allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void release(void* p) {
    std::lock_guard lock(mutex_);
    if (allocations_.erase(reinterpret_cast<uintptr_t>(p)) != 1)
      throw std::logic_error("release: memory this backend did not allocate");
    ::operator delete(p, std::align_val_t(64));
  }
  void upload(void* dst, const void* host, size_t bytes) { std::memcpy(on_device(dst, bytes, "upload"), host, bytes); }
  void download(void* host, const void* src, size_t bytes) { std::memcpy(host, on_device(src, bytes, "download"), bytes); }
  void copy(void* dst, const void* src, size_t bytes) {
    std::memmove(on_device(dst, bytes, "copy"), on_device(src, bytes, "copy"), bytes);
  }
  void zero(void* dst, size_t bytes) { std::memset(on_device(dst, bytes, "zero"), 0, bytes); }

  /// A kernel's view of n elements at p, which must lie in one allocation of this device (not host memory).
  template <class T>
  cuda::cu::Ptr<T> global(T* p, size_t n, const char* what) const {
    return cuda::cu::make_ptr(on_device(p, n * sizeof(T), what), n);
  }
  cuda::cu::Stream stream() const { return nullptr; }
  void launched(const char*) {}  // the emulator throws emu::EmulationError from the launch itself
  void synchronize() {}
  Completion to_host_async(void* host, const void* src, size_t bytes) {
    download(host, src, bytes);
    return {};
  }
  Completion from_host_async(void* dst, const void* host, size_t bytes) {
    upload(dst, host, bytes);
    return {};
  }
  // Batched tier copies: their gathers and scatters run when launched, like every launch here.
  cuda::cu::Stream copy_stream() const { return nullptr; }
  Completion copies_done() { return {}; }

 private:
  template <class T>
  T* on_device(T* p, size_t bytes, const char* what) const {
    std::lock_guard lock(mutex_);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = allocations_.upper_bound(at);
    if (it == allocations_.begin() || at + bytes > std::prev(it)->first + std::prev(it)->second)
      throw std::logic_error(fmt::format("{}: {} bytes at {} are not memory of the CUDA backend (a host pointer, or "
                                         "past the end of a Backend::alloc allocation)",
                                         what, bytes, static_cast<const void*>(p)));
    return p;
  }

  mutable std::mutex mutex_;
  std::map<uintptr_t, size_t> allocations_;  // start -> bytes
};

}  // namespace

std::unique_ptr<Backend> make_cuda_emulated_backend() {
  return std::make_unique<cuda::CoreBackend<EmulatedDevice>>(std::make_shared<EmulatedDevice>());
}

}  // namespace choreo::kernels
