#pragma once
// Errors the CUDA backend's host code raises (kernels/cuda/backend_core.h). That code is compiled by nvcc too,
// which never sees common/error.h (fmt); these are defined once, in host code (backend_errors.cc).

#include <string>

namespace choreo::cuda {

/// Throws choreo::InputError (the CLI prints it and exits 2).
[[noreturn]] void throw_input_error(const std::string& message, const std::string& hint = {});
/// Throws choreo::RuntimeFailure (the environment failed: a device error; exit 1).
[[noreturn]] void throw_runtime_failure(const std::string& message);

}  // namespace choreo::cuda
