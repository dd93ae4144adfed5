#pragma once
// The checkpoint of `choreo finetune train` (written after every epoch beside the adapter, `ADAPTER.gguf` ->
// `ADAPTER.gguf.ckpt`): a GGUF file with the run's settings, the epochs done, the optimiser's step count and
// moments, and every LoRA value, so that `--resume` continues exactly where the run stopped. Its first
// metadata value is an XXH3 checksum of every other byte of the file, so a damaged checkpoint is refused
// rather than resumed from.

#include <string>

#include "runtime/train/graph.h"
#include "runtime/train/trainer.h"

namespace choreo::train {

/// What a checkpoint must agree with to be resumed: the settings that shape the parameters, the optimiser's
/// steps and the split, and the data and model. A resume that differs in any is refused, naming both values.
struct CheckpointKey {
  int rank = 0;
  float alpha = 0;
  std::string targets;
  std::string layers;  // --layers as given (empty: all)
  uint64_t seed = 0;
  double lr = 0;             // AdamW's learning rate
  int accumulate = 1;        // examples per optimiser step
  double val = 0;            // the fraction of the traces held out (0 with validation traces of their own)
  uint64_t traces_xxh3 = 0;  // the traces files' bytes
  uint64_t model_fingerprint = 0;
};

std::string checkpoint_path(const std::string& adapter_path);

/// Writes the checkpoint (crash-safe). InputError when `path` is not a file that can be replaced (a device or
/// FIFO cannot be read back).
void write_checkpoint(const std::string& path, const CheckpointKey& key, const LoraParams<float>& lora,
                      TrainState& state);

/// Reads a checkpoint into `lora` (its pairs already shaped by LoraParams::init) and `state`. InputError
/// naming the file when it is not a checkpoint, when its checksum does not match its bytes (or it has none),
/// or when it was written for other settings (naming the setting's value then and now), traces or model.
void read_checkpoint(const std::string& path, const CheckpointKey& key, LoraParams<float>& lora,
                     TrainState& state);

}  // namespace choreo::train
