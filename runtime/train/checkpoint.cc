#include "runtime/train/checkpoint.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/model/gguf.h"

namespace choreo::train {

namespace {

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

std::string checkpoint_path(const std::string& adapter_path) { return adapter_path + ".ckpt"; }

void write_checkpoint(const std::string& path, const CheckpointKey& key, const LoraParams<float>& lora,
                      TrainState& state) {
  gguf::Writer w;
  w.set_string("general.type", "choreo.finetune.checkpoint");
  w.set_i32("finetune.rank", key.rank);
  w.set_f32("finetune.alpha", key.alpha);
  w.set_string("finetune.targets", key.targets);
  w.set_string("finetune.layers", key.layers);
  w.set_string("finetune.seed", hex(key.seed));
  w.set_string("finetune.traces_xxh3", hex(key.traces_xxh3));
  w.set_string("finetune.model_fingerprint", hex(key.model_fingerprint));
  w.set_i32("finetune.epochs_done", state.epochs_done);
  w.set_string("finetune.adam_steps", std::to_string(state.adam.steps()));
  std::vector<float> values;
  for (float* v : const_cast<LoraParams<float>&>(lora).values()) values.push_back(*v);
  const int64_t n = int64_t(values.size());
  w.add_tensor("lora", {n}, kernels::DType::F32, bytes_of(values));
  w.add_tensor("adam.m", {n}, kernels::DType::F32, bytes_of(state.adam.m()));
  w.add_tensor("adam.v", {n}, kernels::DType::F32, bytes_of(state.adam.v()));
  w.write(path);
}

void read_checkpoint(const std::string& path, const CheckpointKey& key, LoraParams<float>& lora, TrainState& state) {
  const gguf::File f = gguf::File::open(path);
  const auto mismatch = [&](const std::string& what) {
    return InputError(fmt::format("{}: the checkpoint was written {}", path, what),
                      "resume with the settings, traces and model that started the run, or start again without --resume");
  };
  if (f.get_string("general.type", "") != "choreo.finetune.checkpoint")
    throw InputError(fmt::format("{}: not a choreo finetune checkpoint", path));
  if (f.get_int("finetune.rank", -1) != key.rank || float(f.get_float("finetune.alpha", -1)) != key.alpha ||
      f.get_string("finetune.targets", "") != key.targets || f.get_string("finetune.layers", "") != key.layers)
    throw mismatch("with another --rank, --alpha, --targets or --layers");
  if (f.get_string("finetune.seed", "") != hex(key.seed)) throw mismatch("with another --seed");
  if (f.get_string("finetune.traces_xxh3", "") != hex(key.traces_xxh3)) throw mismatch("for another traces file");
  if (f.get_string("finetune.model_fingerprint", "") != hex(key.model_fingerprint))
    throw mismatch("for another model");
  const std::vector<float*> values = lora.values();
  const auto tensor = [&](const char* name) {
    const gguf::TensorInfo* t = f.tensor(name);
    if (!t || t->type != kernels::DType::F32 || t->n_elements() != int64_t(values.size()))
      throw InputError(fmt::format("{}: the checkpoint's {} is missing or has another size than the {} LoRA values",
                                   path, name, values.size()));
    std::vector<float> out(values.size());
    if (!out.empty()) std::memcpy(out.data(), t->data, out.size() * sizeof(float));
    return out;
  };
  const std::vector<float> saved = tensor("lora");
  for (size_t i = 0; i < values.size(); ++i) *values[i] = saved[i];
  state.adam = AdamW(values.size());
  state.adam.m() = tensor("adam.m");
  state.adam.v() = tensor("adam.v");
  try {
    state.adam.set_steps(std::stoull(f.get_string("finetune.adam_steps", "0")));
  } catch (const std::exception&) {
    throw InputError(fmt::format("{}: the checkpoint's step count is not a number", path));
  }
  state.epochs_done = int(f.get_int("finetune.epochs_done", 0));
  if (state.epochs_done < 0) throw InputError(fmt::format("{}: the checkpoint's epoch count is negative", path));
}

}  // namespace choreo::train
