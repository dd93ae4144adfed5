// kernels::make_backend: the backend a command runs on, chosen by name (the CLI's --backend).

#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/backend.h"
#if defined(CHOREO_WITH_CUDA)
#include "kernels/cuda/device/cuda_backend.h"
#endif

namespace choreo::kernels {

bool built_with_cuda() {
#if defined(CHOREO_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if defined(CHOREO_WITH_CUDA)
  return cuda::device_count();
#else
  return 0;
#endif
}

bool load_cuda_blas() {
#if defined(CHOREO_WITH_CUDA)
  cuda::load_blas_library();
  return true;
#else
  return false;
#endif
}

namespace {

/// $CHOREO_EMULATED_DEVICE_MIB (a test knob: the emulated device's memory), in bytes; 0 when unset.
size_t emulated_device_bytes() {
  const char* text = std::getenv("CHOREO_EMULATED_DEVICE_MIB");
  if (!text || !*text) return 0;
  const std::string_view digits(text);
  size_t mib = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), mib);
  if (error != std::errc() || end != digits.data() + digits.size() || mib == 0 || mib > (size_t(1) << 30))
    throw InputError(fmt::format("CHOREO_EMULATED_DEVICE_MIB='{}' is not a number of MiB", digits),
                     "give the emulated CUDA device's memory in MiB (1 or more), or unset it for no limit");
  return mib << 20;
}

}  // namespace

std::unique_ptr<Backend> make_backend(std::string_view name, int n_threads, int device) {
  if (name == "cpu") return make_cpu_backend(n_threads);
  if (name == "cuda-emulated") {
    std::unique_ptr<Backend> backend = make_cuda_emulated_backend(emulated_device_bytes());
    backend->set_threads(n_threads);
    return backend;
  }
  if (name == "cuda") {
#if defined(CHOREO_WITH_CUDA)
    return cuda::make_device_backend(device);
#else
    throw InputError("this choreo was built without the CUDA backend (no nvcc was found when it was configured)",
                     "install the CUDA toolkit and configure with -DCHOREO_CUDA=ON, or use --backend cpu");
#endif
  }
  throw InputError(fmt::format("unknown backend '{}'", name), "use --backend cpu, cuda or cuda-emulated");
}

}  // namespace choreo::kernels
