// Whether this machine has a CUDA device, and why not: the CUDA runtime's device count, apart from the
// backend (cuda_backend.cu) so that cuda_selftest can ask without linking the backend's kernels a second
// time.

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "kernels/cuda/device/cuda_backend.h"

namespace choreo::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n > 0 ? "" : "the driver reports none";
  cudaGetLastError();
  if (e != cudaErrorInsufficientDriver) return cudaGetErrorString(e);
  // The runtime says "driver version is insufficient" both without a driver and with one too old for it: tell
  // the two apart, since only the second is about versions.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) return std::string("no NVIDIA driver is installed (") + dlerror() + ")";
  dlclose(driver);
  int driver_version = 0;
  cudaDriverGetVersion(&driver_version);
  const auto cuda = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  return "the NVIDIA driver supports CUDA " + cuda(driver_version) +
         ", older than this build's runtime (CUDA " + cuda(CUDART_VERSION) + ")";
}

}  // namespace choreo::cuda
