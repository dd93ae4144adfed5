#pragma once
// Models the tests load: a CPU backend with a model on it, and the shared models loaded once per binary.

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/llama.h"
#include "tests/test_paths.h"

namespace choreo::testing {

/// A backend (by default the CPU's, 2 threads) and a model loaded on it; the backend outlives the model.
struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::Model> model;
  explicit LoadedModel(const std::string& path, std::unique_ptr<kernels::Backend> on = kernels::make_cpu_backend(2))
      : backend(std::move(on)) {
    model = model::Model::load(path, *backend);
  }
};

/// A CPU backend (2 threads, like the models') for tests that need KV pages without a model.
inline kernels::Backend& cpu_backend() {
  static std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2);
  return *backend;
}

/// A backend of the conformance tests, which are written once against kernels::Backend.
struct NamedBackend {
  const char* name;
  kernels::Backend& backend;
};
/// Every backend present: the CPU's, the CUDA backend run by the block emulator, and the CUDA backend on
/// device 0 when this build has it and the machine has a GPU (scripts/gpu_check.sh).
inline std::vector<NamedBackend> conformance_backends() {
  static std::unique_ptr<kernels::Backend> emulated = kernels::make_cuda_emulated_backend();
  static std::unique_ptr<kernels::Backend> device =
      kernels::cuda_device_count() > 0 ? kernels::make_backend("cuda", 1, 0) : nullptr;
  std::vector<NamedBackend> all = {{"cpu", cpu_backend()}, {"cuda-emulated", *emulated}};
  if (device) all.push_back({"cuda", *device});
  return all;
}

/// stories260K (F32, SentencePiece vocab), loaded on first use and shared by every test of the binary.
inline LoadedModel& stories260k() {
  static LoadedModel loaded(shared_file("models/stories260K.gguf"));
  return loaded;
}

/// stories260K on the CUDA backend's kernels run by the block emulator (kernels::make_cuda_emulated_backend),
/// loaded on first use and shared by every test of the binary.
inline LoadedModel& stories260k_cuda_emulated() {
  static LoadedModel loaded(shared_file("models/stories260K.gguf"), kernels::make_cuda_emulated_backend());
  return loaded;
}

/// stories260K on the CUDA backend on device 0, or null when there is none (a build without nvcc, a machine
/// without a GPU): the tests that run on the emulated backend run here too (scripts/gpu_check.sh).
inline LoadedModel* stories260k_cuda_device() {
  static std::unique_ptr<LoadedModel> loaded =
      kernels::cuda_device_count() > 0
          ? std::make_unique<LoadedModel>(shared_file("models/stories260K.gguf"), kernels::make_backend("cuda", 1, 0))
          : nullptr;
  return loaded.get();
}

/// The default instruct model (SmolLM2-135M-Instruct Q4_1, as scripts/setup.sh installs it), loaded on first use
/// and shared by every test of the binary; a missing file fails the test with a hint.
inline LoadedModel& smollm2() {
  static LoadedModel loaded(require_file(default_model()));
  return loaded;
}

}  // namespace choreo::testing
