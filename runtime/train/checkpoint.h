#pragma once
// The checkpoint of `choreo finetune train` (written after every epoch beside the adapter, `ADAPTER.gguf` ->
// `ADAPTER.gguf.ckpt`): a GGUF file with the run's settings, the epochs done, the optimiser's step count and
// moments, and every LoRA value, so that `--resume` continues exactly where the run stopped.

#include <string>

#include "runtime/train/graph.h"
#include "runtime/train/trainer.h"

namespace choreo::train {

/// What a checkpoint must agree with to be resumed: the settings that shape the parameters and the data.
struct CheckpointKey {
  int rank = 0;
  float alpha = 0;
  std::string targets;
  uint64_t seed = 0;
  uint64_t traces_xxh3 = 0;  // the traces file's bytes
  uint64_t model_fingerprint = 0;
  std::string layers;  // --layers as given (empty: all)
};

std::string checkpoint_path(const std::string& adapter_path);

/// Writes the checkpoint (crash-safe).
void write_checkpoint(const std::string& path, const CheckpointKey& key, const LoraParams<float>& lora,
                      TrainState& state);

/// Reads a checkpoint into `lora` (its pairs already shaped by LoraParams::init) and `state`. InputError
/// naming the file when it is not a checkpoint, or was written for other settings, traces or model.
void read_checkpoint(const std::string& path, const CheckpointKey& key, LoraParams<float>& lora, TrainState& state);

}  // namespace choreo::train
