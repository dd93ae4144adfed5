#pragma once
// Trained LoRA pairs (runtime/train/graph.h) as a llama.cpp GGUF LoRA adapter (general.type = adapter,
// adapter.type = lora, adapter.lora.alpha; tensors `blk.N.<weight>.weight.lora_a` of ggml shape [n_in, rank]
// and `.lora_b` of [rank, n_out], F32), which llama.cpp's --lora, choreo's --lora and workflows' models: load.

#include <string>

#include "runtime/model/llama.h"
#include "runtime/train/graph.h"

namespace choreo::train {

/// Writes `lora` for `base` to `path` (crash-safe: a temporary file renamed into place). InputError when a
/// pair adapts the output projection of a model whose output is tied to its embeddings (llama.cpp names no
/// such tensor), or when `path` cannot be written.
void write_adapter(const model::Model& base, const LoraParams<float>& lora, const std::string& path,
                   const std::string& name = "choreo finetune");

}  // namespace choreo::train
