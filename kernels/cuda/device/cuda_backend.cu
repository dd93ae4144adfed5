// The CUDA backend on a device (issue 14): kernels/cuda/backend_core.h with the CUDA runtime as its Device
// layer. This file is all that differs from the emulated backend (kernels/cuda/emu/emulated_backend.cc),
// whose host logic and kernels are the same source, run and checked on the CPU; this layer has never run on a
// GPU (none was available: docs/cuda.md).
//
// - Memory: cudaMalloc / cudaFree; an allocation the device has no room for is an InputError naming what did
//   not fit, the device's free memory, the KV budget and the flags to lower (backend_core.h). Host memory for
//   the tiers (alloc_host: T1's copies) is pinned, cudaHostAlloc / cudaFreeHost, so that tier copies from and
//   to it are DMA transfers on the copy stream.
// - Streams: every launch, copy and memset of an operation goes to one compute stream; upload and download
//   wait for it (Backend: "done when they return"); an operation's staged metadata does not. Tier copies (copy_to_host / copy_from_host, and the
//   batched copy_pages_to_host / copy_pages_from_host with their gather and scatter kernels) go to a second
//   stream, after an event recorded on the compute stream (a page is copied only after the kernels that wrote
//   it), and complete through a host callback on that stream, so compute never waits for them.
// - Errors: every runtime call is checked; after every launch cudaGetLastError names the kernel (run with
//   CUDA_LAUNCH_BLOCKING=1 to attribute an asynchronous fault to its launch).
// - Products of F32, F16 and BF16 weights: cuBLASLt with one algorithm pinned per shape (device/gemm_lt.h), on
//   the compute stream.
// - Tier copies whose host side is not the pinned pool's (a T2 entry's mapped file, a value read from Redis, a
//   buffer written to T2 or T3) go through a pinned staging range (backend_core.h, docs/cuda.md), so every
//   batched tier copy is a DMA from or to pinned memory.

#include <cuda_runtime.h>

#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "kernels/cuda/backend.cuh"
#include "kernels/cuda/backend_errors.h"
#include "kernels/cuda/device/cuda_backend.h"
#include "kernels/cuda/device/gemm_lt.h"

namespace choreo::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw_runtime_failure(std::string("CUDA: ") + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

class CudaDevice {
 public:
  explicit CudaDevice(int device) : device_(device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    gemm_ = std::make_unique<PinnedGemm>();  // after cudaSetDevice: its handle belongs to this device
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;
  ~CudaDevice() {
    cudaDeviceSynchronize();
    cudaEventDestroy(computed_);
    cudaStreamDestroy(copies_);
    cudaStreamDestroy(compute_);
  }

  std::string name() const { return "cuda"; }
  std::string label() const { return "CUDA device " + std::to_string(device_); }

  void* alloc(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it
      return nullptr;      // CoreBackend raises the error, with the KV budget
    }
    check(e, "cudaMalloc");
    return p;
  }
  void release(void* p) { cudaFree(p); }  // from destructors: an error here has nothing to stop
  std::optional<choreo::kernels::Backend::DeviceMemory> memory() const {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return choreo::kernels::Backend::DeviceMemory{free, total};
  }
  void* alloc_host(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw_no_pinned_memory(label(), bytes);
    }
    check(e, "cudaHostAlloc");
    return p;
  }
  void release_host(void* p) { cudaFreeHost(p); }  // from destructors, as release
  void upload(void* dst, const void* host, size_t bytes) {
    check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, compute_), "cudaMemcpyAsync (upload)");
    check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize (upload)");
  }
  /// Per-call metadata: ordered on the compute stream, not waited for. From pageable memory the runtime has
  /// copied the source before cudaMemcpyAsync returns (it stages it, or synchronises), so the caller may reuse
  /// it; the launches that read the destination, and the next upload into it, come later on the same stream.
  void upload_staged(void* dst, const void* host, size_t bytes) {
    check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, compute_), "cudaMemcpyAsync (staged upload)");
  }
  void download(void* host, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, compute_), "cudaMemcpyAsync (download)");
    check(cudaStreamSynchronize(compute_), "cudaStreamSynchronize (download)");
  }
  void copy(void* dst, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_), "cudaMemcpyAsync (copy)");
  }
  void zero(void* dst, size_t bytes) { check(cudaMemsetAsync(dst, 0, bytes, compute_), "cudaMemsetAsync"); }

  template <class T>
  cu::Ptr<T> global(T* p, size_t n, const char*) const {
    return cu::make_ptr(p, n);
  }
  cu::Stream stream() const { return compute_; }
  void launched(const char* kernel) { check(cudaGetLastError(), kernel); }
  void gemm(const blas::Gemm& g) { gemm_->run(g, compute_); }
  void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

  choreo::kernels::Completion to_host_async(void* host, const void* src, size_t bytes) {
    after_compute();
    check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, copies_), "cudaMemcpyAsync (to host)");
    return copies_done();
  }
  choreo::kernels::Completion from_host_async(void* dst, const void* host, size_t bytes) {
    after_compute();  // the page's zeroing at allocation, on the compute stream, comes first
    check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, copies_), "cudaMemcpyAsync (from host)");
    return copies_done();
  }
  /// Batched tier copies (CoreBackend::copy_pages_to_host / copy_pages_from_host) launch their gathers and
  /// scatters here, between the copies above.
  cu::Stream copy_stream() const { return copies_; }
  /// Done when the copy stream reaches this point: a host callback fulfils the promise.
  choreo::kernels::Completion copies_done() {
    auto promise = std::make_unique<std::promise<void>>();
    std::shared_future<void> done = promise->get_future().share();
    check(cudaLaunchHostFunc(
              copies_,
              [](void* p) {
                std::unique_ptr<std::promise<void>> owned(static_cast<std::promise<void>*>(p));
                owned->set_value();
              },
              promise.get()),
          "cudaLaunchHostFunc");
    promise.release();
    return choreo::kernels::Completion(std::move(done));
  }
  /// `f` runs in the runtime's callback thread once the copy stream reaches this point (it makes no CUDA call).
  void after_copies(std::function<void()> f) {
    auto owned = std::make_unique<std::function<void()>>(std::move(f));
    check(cudaLaunchHostFunc(
              copies_,
              [](void* p) {
                std::unique_ptr<std::function<void()>> run(static_cast<std::function<void()>*>(p));
                (*run)();
              },
              owned.get()),
          "cudaLaunchHostFunc");
    owned.release();
  }

 private:
  /// The copy stream waits for the work issued to the compute stream so far (not for later work).
  void after_compute() {
    check(cudaEventRecord(computed_, compute_), "cudaEventRecord");
    check(cudaStreamWaitEvent(copies_, computed_, 0), "cudaStreamWaitEvent");
  }

  int device_ = 0;
  cudaStream_t compute_ = nullptr, copies_ = nullptr;
  cudaEvent_t computed_ = nullptr;
  std::unique_ptr<PinnedGemm> gemm_;
};

}  // namespace

std::unique_ptr<choreo::kernels::Backend> make_device_backend(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw_input_error("no CUDA device: " + no_device_reason(),
                      "run on a machine with an NVIDIA GPU and its driver, or use --backend cpu");
  if (device < 0 || device >= n)
    throw_input_error("CUDA device " + std::to_string(device) + " does not exist (the driver reports " + std::to_string(n) + ")",
                      "pick a device from 0 to " + std::to_string(n - 1));
  return std::make_unique<CoreBackend<CudaDevice>>(std::make_shared<CudaDevice>(device));
}

}  // namespace choreo::cuda
