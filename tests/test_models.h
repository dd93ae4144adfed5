#pragma once
// Models the tests load: a CPU backend with a model on it, and the shared tiny model loaded once per binary.

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

/// stories260K (F32, SentencePiece vocab), loaded on first use and shared by every test of the binary.
inline LoadedModel& stories260k() {
  static LoadedModel loaded(shared_file("models/stories260K.gguf"));
  return loaded;
}

}  // namespace choreo::testing
