#pragma once
// The CUDA backend on a device (kernels/cuda/device/cuda_backend.cu, built by nvcc when CMake finds it; see
// kernels::make_backend). No CUDA header needed to call it.

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace choreo::cuda {

/// kernels/cuda/backend_core.h on CUDA device `device`. An InputError when the driver reports no device (the
/// message gives the driver's reason) or `device` is not one of them.
std::unique_ptr<choreo::kernels::Backend> make_device_backend(int device);
/// The devices the CUDA driver reports: 0 without a driver or a GPU (device/presence.cu, as the next).
int device_count();
/// Why there is no CUDA device, in words ("" when there is one): no NVIDIA driver installed, a driver older
/// than this build's CUDA runtime, no GPU, or the runtime's own error.
std::string no_device_reason();
/// Loads cuBLASLt (device/gemm_lt.cu) if it is not loaded yet: an InputError when it cannot be.
void load_blas_library();

}  // namespace choreo::cuda
