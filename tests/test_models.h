#pragma once
// Models the tests load: a CPU backend with a model on it, and the shared models loaded once per binary.

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
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
/// Whether $CHOREO_REQUIRE_CUDA_DEVICE is 1 (gpu-bundle/run.sh sets it): then a test that runs on a CUDA device
/// fails without one instead of passing over it.
inline bool cuda_device_required() {
  const char* required = std::getenv("CHOREO_REQUIRE_CUDA_DEVICE");
  return required && std::string_view(required) == "1";
}
/// Whether the machine has a CUDA device for the tests; without one, a std::runtime_error (a failed test) when
/// cuda_device_required().
inline bool cuda_device_present() {
  const bool present = kernels::cuda_device_count() > 0;
  if (!present && cuda_device_required())
    throw std::runtime_error("no CUDA device, and $CHOREO_REQUIRE_CUDA_DEVICE=1 asks the tests to run on one");
  return present;
}

/// Every backend present: the CPU's, the CUDA backend run by the block emulator, and the CUDA backend on
/// device 0 when this build has it and the machine has a GPU. $CHOREO_CONFORMANCE_BACKENDS (names, comma
/// separated) keeps only those named: gpu-bundle/run.sh runs the conformance tests on "cuda" alone, without the
/// slow emulated backend.
inline std::vector<NamedBackend> conformance_backends() {
  static std::unique_ptr<kernels::Backend> emulated = kernels::make_cuda_emulated_backend();
  static std::unique_ptr<kernels::Backend> device = cuda_device_present() ? kernels::make_backend("cuda", 1, 0) : nullptr;
  std::vector<NamedBackend> all = {{"cpu", cpu_backend()}, {"cuda-emulated", *emulated}};
  if (device) all.push_back({"cuda", *device});
  const char* only = std::getenv("CHOREO_CONFORMANCE_BACKENDS");
  if (!only) return all;
  const std::string names = std::string(",") + only + ",";
  std::vector<NamedBackend> kept;
  for (const NamedBackend& b : all)
    if (names.find(std::string(",") + b.name + ",") != std::string::npos) kept.push_back(b);
  return kept;
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
/// without a GPU; a failed test when cuda_device_required()): the device's test cases ("... on a CUDA device",
/// "cuda device: ...") run on it (gpu-bundle/run.sh, scripts/gpu_check.sh).
inline LoadedModel* stories260k_cuda_device() {
  static std::unique_ptr<LoadedModel> loaded =
      cuda_device_present()
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
