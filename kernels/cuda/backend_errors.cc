#include "kernels/cuda/backend_errors.h"

#include "common/error.h"

namespace choreo::cuda {

void throw_input_error(const std::string& message, const std::string& hint) { throw InputError(message, hint); }
void throw_runtime_failure(const std::string& message) { throw RuntimeFailure(message); }

}  // namespace choreo::cuda
