#include "kernels/cuda/backend_errors.h"

#include "common/error.h"

namespace choreo::cuda {

void throw_input_error(const std::string& message, const std::string& hint) { throw InputError(message, hint); }
void throw_runtime_failure(const std::string& message) { throw RuntimeFailure(message); }

namespace {

std::string mib(size_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / 1048576.0); }

}  // namespace

void throw_no_device_memory(const std::string& device, size_t bytes, size_t free_bytes, size_t total_bytes,
                            size_t kv_budget_bytes) {
  const std::string budget =
      kv_budget_bytes > 0 ? fmt::format("; the KV cache budget (T0, --cache-mib) is {}", mib(kv_budget_bytes))
                          : "";
  throw InputError(
      fmt::format("{} has no room for {} ({} free of {}{})", device, mib(bytes), mib(free_bytes),
                  mib(total_bytes), budget),
      "the model's weights, its activations and the KV cache budget must fit in device memory: lower "
      "--cache-mib (T0, the device tier), run fewer calls at once, or use a smaller model");
}

void throw_no_pinned_memory(const std::string& device, size_t bytes) {
  throw InputError(
      fmt::format("{} could not pin {} of host memory for the KV tier T1", device, mib(bytes)),
      "T1 is pinned host memory on a GPU: lower --host-cache-mib, or raise the locked-memory limit");
}

}  // namespace choreo::cuda
