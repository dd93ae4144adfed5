#pragma once
// LoRA adapters for tests: the trained SmolLM2 math adapter from ../shared, and adapters written from it.

#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "runtime/model/gguf.h"
#include "tests/test_paths.h"

namespace choreo::testing {

/// ../shared/models/smollm2-135m-instruct-math-lora.gguf: rank 8, alpha 16, F32, on q/k/v/o/gate/up/down of
/// all 30 layers of SmolLM2-135M-Instruct (../shared/README.md).
inline std::string math_lora() { return shared_file("models/smollm2-135m-instruct-math-lora.gguf"); }

/// Writes to `dst` an adapter built from `src`'s tensors: `rename(name)` gives the tensor whose data is stored
/// under `name` (same shape and type). The metadata is `src`'s, or what `metadata` writes when given.
inline void write_adapter_from(const std::string& src, const std::string& dst,
                               const std::function<std::string(const std::string&)>& rename,
                               const std::function<void(gguf::Writer&)>& metadata = {}) {
  const gguf::File f = gguf::File::open(src);
  gguf::Writer w;
  if (metadata) {
    metadata(w);
  } else {
    for (const auto& [key, value] : f.metadata()) w.set(key, value);
  }
  for (const gguf::TensorInfo& t : f.tensors()) {
    const gguf::TensorInfo* from = f.tensor(rename(t.name));
    REQUIRE_MESSAGE(from != nullptr, "no tensor ", rename(t.name));
    REQUIRE(from->shape == t.shape);
    w.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(from->data, from->data + from->n_bytes));
  }
  w.write(dst);
}

/// A second real-valued adapter of the math adapter's shapes: layer l holds the math adapter's pairs of layer
/// (l + 1) % 30. Different from it everywhere, with the same magnitudes.
inline void write_shifted_math_lora(const std::string& dst) {
  write_adapter_from(math_lora(), dst, [](const std::string& name) {
    // blk.N.rest -> blk.(N+1)%30.rest
    const size_t dot = name.find('.', 4);
    const int layer = std::stoi(name.substr(4, dot - 4));
    return "blk." + std::to_string((layer + 1) % 30) + name.substr(dot);
  });
}

}  // namespace choreo::testing
