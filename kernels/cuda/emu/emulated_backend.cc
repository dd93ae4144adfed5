// The CUDA backend on the CPU (issue 14): kernels/cuda/backend_core.h's host logic with an emulated device.
// Every operation launches the kernel source of kernels/cuda/kernels/*.cuh through the block emulator, so a
// whole model, the engine and the conformance tests run on choreo's CUDA backend with no GPU; every launch is
// checked for out-of-bounds accesses, shared-memory races and divergent barriers.
//
// The emulated device's memory is host memory that it keeps a record of. Every array an operation reads or
// writes must lie in one of its allocations: a host pointer handed to an operation is an error, as it would
// be on a GPU, so the model code's use of backend memory (weights uploaded, activations in Buffers, metadata
// staged) is checked here. Copies are done when they return; the emulator runs every block on the calling
// thread, so there is nothing to synchronise.
//
// Its memory may be bounded (make_cuda_emulated_backend(device_bytes), the CLI's
// $CHOREO_EMULATED_DEVICE_MIB): an allocation beyond it fails as a full GPU's does, so budgets are checked
// here as on a device. alloc_host memory stands for pinned memory: it is recorded too, and every tier copy is
// counted by whether its host side lies in it (emulated_host_copies), so tests can see that T1's copies are
// the ones a GPU would do by DMA.

#include <atomic>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "kernels/backend.h"
#include "kernels/cuda/backend.cuh"

namespace choreo::kernels {

namespace {

class EmulatedDevice {
 public:
  /// capacity_bytes 0: unlimited.
  explicit EmulatedDevice(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  std::string name() const { return "cuda-emulated"; }
  std::string label() const {
    return capacity_ ? fmt::format("the emulated CUDA device ({} MiB)", capacity_ >> 20)
                     : "the emulated CUDA device";
  }

  void* alloc(size_t bytes) {
    std::lock_guard lock(mutex_);
    if (capacity_ && bytes > capacity_ - in_use_) return nullptr;
    void* p = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64));
    allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    in_use_ += bytes;
    return p;
  }
  void release(void* p) {
    std::lock_guard lock(mutex_);
    auto it = allocations_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocations_.end()) throw std::logic_error("release: memory this backend did not allocate");
    in_use_ -= it->second;
    allocations_.erase(it);
    ::operator delete(p, std::align_val_t(64));
  }
  std::optional<Backend::DeviceMemory> memory() const {
    std::lock_guard lock(mutex_);
    if (!capacity_) return std::nullopt;
    return Backend::DeviceMemory{capacity_ - in_use_, capacity_};
  }
  /// Host memory, recorded as pinned (not device memory: an operation handed it is still refused).
  void* alloc_host(size_t bytes) {
    void* p = ::operator new(bytes, std::align_val_t(64));
    std::lock_guard lock(mutex_);
    pinned_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void release_host(void* p) {
    {
      std::lock_guard lock(mutex_);
      if (pinned_.erase(reinterpret_cast<uintptr_t>(p)) != 1)
        throw std::logic_error("release_host: memory this backend did not allocate");
    }
    ::operator delete(p, std::align_val_t(64));
  }
  HostCopyCounts host_copies() const {
    std::lock_guard lock(mutex_);
    return copies_;
  }
  void upload(void* dst, const void* host, size_t bytes) { std::memcpy(on_device(dst, bytes, "upload"), host, bytes); }
  void upload_staged(void* dst, const void* host, size_t bytes) { upload(dst, host, bytes); }
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
  /// cuBLAS in emulation: kernels/cuda/blas.h's CPU GEMM (every element summed over k in order).
  void gemm(const cuda::blas::Gemm& g) { cuda::blas::gemm_emulated(g); }
  void synchronize() {}
  Completion to_host_async(void* host, const void* src, size_t bytes) {
    count_copy(host, bytes);
    download(host, src, bytes);
    return {};
  }
  Completion from_host_async(void* dst, const void* host, size_t bytes) {
    count_copy(host, bytes);
    upload(dst, host, bytes);
    return {};
  }
  // Batched tier copies: their gathers and scatters run when launched, like every launch here.
  cuda::cu::Stream copy_stream() const { return nullptr; }
  Completion copies_done() { return {}; }
  void after_copies(const std::function<void()>& f) { f(); }  // the copies above are done when they return

 private:
  /// Whether [p, p + bytes) lies in one allocation of `in`.
  static bool within(const std::map<uintptr_t, size_t>& in, const void* p, size_t bytes) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    auto it = in.upper_bound(at);
    return it != in.begin() && at + bytes <= std::prev(it)->first + std::prev(it)->second;
  }
  void count_copy(const void* host, size_t bytes) {
    std::lock_guard lock(mutex_);
    if (within(pinned_, host, bytes)) {
      ++copies_.pinned;
      copies_.pinned_bytes += bytes;
    } else {
      ++copies_.pageable;
      copies_.pageable_bytes += bytes;
    }
  }
  template <class T>
  T* on_device(T* p, size_t bytes, const char* what) const {
    std::lock_guard lock(mutex_);
    if (!within(allocations_, p, bytes))
      throw std::logic_error(fmt::format("{}: {} bytes at {} are not memory of the CUDA backend (a host pointer, or "
                                         "past the end of a Backend::alloc allocation)",
                                         what, bytes, static_cast<const void*>(p)));
    return p;
  }

  mutable std::mutex mutex_;
  std::map<uintptr_t, size_t> allocations_;  // device memory: start -> bytes
  std::map<uintptr_t, size_t> pinned_;       // alloc_host memory: start -> bytes
  size_t capacity_ = 0, in_use_ = 0;         // bytes of device memory; capacity 0: unlimited
  HostCopyCounts copies_;
};

using EmulatedBackend = cuda::CoreBackend<EmulatedDevice>;

}  // namespace

std::unique_ptr<Backend> make_cuda_emulated_backend(size_t device_bytes) {
  return std::make_unique<EmulatedBackend>(std::make_shared<EmulatedDevice>(device_bytes));
}

HostCopyCounts emulated_host_copies(const Backend& backend) {
  const auto* emulated = dynamic_cast<const EmulatedBackend*>(&backend);
  if (!emulated)
    throw std::invalid_argument("emulated_host_copies: " + backend.name() +
                                " is not the emulated CUDA backend");
  return emulated->device().host_copies();
}

}  // namespace choreo::kernels
