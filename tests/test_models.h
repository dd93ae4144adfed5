#pragma once
// Models the tests load: a CPU backend with a model on it, and the shared models loaded once per binary.

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "runtime/model/llama.h"
#include "tests/test_paths.h"

namespace choreo::testing {

/// A CPU backend (2 threads) and a model loaded on it; the backend outlives the model.
struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2);
  std::unique_ptr<model::Model> model;
  explicit LoadedModel(const std::string& path) { model = model::Model::load(path, *backend); }
};

/// A CPU backend (2 threads, like the models') for tests that need KV pages without a model.
inline kernels::Backend& cpu_backend() {
  static std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2);
  return *backend;
}

/// stories260K (F32, SentencePiece vocab), loaded on first use and shared by every test of the binary.
inline LoadedModel& stories260k() {
  static LoadedModel loaded(shared_file("models/stories260K.gguf"));
  return loaded;
}

/// The default instruct model (SmolLM2-135M-Instruct Q4_1, as scripts/setup.sh installs it), loaded on first use
/// and shared by every test of the binary; a missing file fails the test with a hint.
inline LoadedModel& smollm2() {
  static LoadedModel loaded(require_file(default_model()));
  return loaded;
}

}  // namespace choreo::testing
