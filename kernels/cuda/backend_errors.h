#pragma once
// Errors the CUDA backend's host code raises (kernels/cuda/backend_core.h). That code is compiled by nvcc too,
// which never sees common/error.h (fmt); these are defined once, in host code (backend_errors.cc).

#include <cstddef>
#include <string>

namespace choreo::cuda {

/// Throws choreo::InputError (the CLI prints it and exits 2).
[[noreturn]] void throw_input_error(const std::string& message, const std::string& hint = {});
/// Throws choreo::RuntimeFailure (the environment failed: a device error; exit 1).
[[noreturn]] void throw_runtime_failure(const std::string& message);
/// Throws the InputError of a device allocation of `bytes` that `device` has no room for: its free and total
/// memory, the KV cache budget (T0, --cache-mib; 0: none set) and the flags to lower.
[[noreturn]] void throw_no_device_memory(const std::string& device, size_t bytes, size_t free_bytes, size_t total_bytes,
                                         size_t kv_budget_bytes);
/// Throws the InputError of `bytes` of pinned host memory (for T1's copies) that `device` could not have.
[[noreturn]] void throw_no_pinned_memory(const std::string& device, size_t bytes);

}  // namespace choreo::cuda
