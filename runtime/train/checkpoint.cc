#include "runtime/train/checkpoint.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/model/gguf.h"

namespace choreo::train {

namespace {

constexpr std::string_view kType = "choreo.finetune.checkpoint";
constexpr std::string_view kChecksumKey = "finetune.checksum";
constexpr size_t kChecksumDigits = 16;
/// The checksum is the first metadata value, so its digits sit at a fixed offset: after GGUF's header (magic,
/// version, tensor and metadata counts: 4 + 4 + 8 + 8 bytes), the key (its length, 8 bytes, then its
/// characters), the value's type (4 bytes) and the string's length (8 bytes).
constexpr size_t kChecksumAt = 24 + 8 + kChecksumKey.size() + 4 + 8;

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

/// XXH3 of every byte of the file but the checksum's digits.
std::string checksum_of(std::span<const uint8_t> file) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, file.data(), kChecksumAt);
  XXH3_64bits_update(state, file.data() + kChecksumAt + kChecksumDigits,
                     file.size() - kChecksumAt - kChecksumDigits);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hex(h);
}

/// A setting the checkpoint records: its metadata key, how the command line names it, its value as text.
struct Setting {
  const char* key;
  const char* flag;
  std::string value;
};

std::vector<Setting> settings_of(const CheckpointKey& k) {
  return {{"finetune.rank", "--rank", std::to_string(k.rank)},
          {"finetune.alpha", "--alpha", fmt::format("{}", k.alpha)},
          {"finetune.targets", "--targets", k.targets},
          {"finetune.layers", "--layers", k.layers.empty() ? "all" : k.layers},
          {"finetune.seed", "--seed", std::to_string(k.seed)},
          {"finetune.lr", "--lr", fmt::format("{}", k.lr)},
          {"finetune.accumulate", "--accumulate", std::to_string(k.accumulate)},
          {"finetune.val", "--val", fmt::format("{}", k.val)},
          {"finetune.traces_xxh3", "traces of XXH3", hex(k.traces_xxh3)},
          {"finetune.model_fingerprint", "a model of fingerprint", hex(k.model_fingerprint)}};
}

/// InputError unless the file's first metadata value is a checksum that matches its bytes.
void check_checksum(const gguf::File& f, const std::string& path) {
  const auto& first = f.metadata().front();  // (a checkpoint has its type, so at least one value)
  const std::span<const uint8_t> bytes = f.bytes();
  if (first.first != kChecksumKey || first.second.type != gguf::ValueType::STRING ||
      std::get<std::string>(first.second.scalar).size() != kChecksumDigits)
    throw InputError(fmt::format("{}: the checkpoint has no checksum (an older choreo wrote it)", path),
                     "start again without --resume");
  const std::string_view saved(reinterpret_cast<const char*>(bytes.data()) + kChecksumAt, kChecksumDigits);
  if (saved != checksum_of(bytes))
    throw InputError(
        fmt::format("{}: the checkpoint is damaged: its checksum does not match its bytes", path),
        "start again without --resume");
}

void check_settings(const gguf::File& f, const std::string& path, const CheckpointKey& key) {
  for (const Setting& s : settings_of(key)) {
    const std::string saved = f.get_string(s.key, "(none)");
    if (saved != s.value)
      throw InputError(
          fmt::format("{}: the checkpoint was written with {} {}; this run has {} {}", path, s.flag, saved,
                      s.flag, s.value),
          "resume with the settings, traces and model that started the run, or start again without "
          "--resume");
  }
}

}  // namespace

std::string checkpoint_path(const std::string& adapter_path) { return adapter_path + ".ckpt"; }

void write_checkpoint(const std::string& path, const CheckpointKey& key, const LoraParams<float>& lora,
                      TrainState& state) {
  gguf::Writer w;
  w.set_string(std::string(kChecksumKey), std::string(kChecksumDigits, '0'));  // first: filled in below
  w.set_string("general.type", std::string(kType));
  for (const Setting& s : settings_of(key)) w.set_string(s.key, s.value);
  w.set_i32("finetune.epochs_done", state.epochs_done);
  w.set_string("finetune.adam_steps", std::to_string(state.adam.steps()));
  std::vector<float> values;
  for (float* v : const_cast<LoraParams<float>&>(lora).values()) values.push_back(*v);
  const int64_t n = int64_t(values.size());
  w.add_tensor("lora", {n}, kernels::DType::F32, bytes_of(values));
  w.add_tensor("adam.m", {n}, kernels::DType::F32, bytes_of(state.adam.m()));
  w.add_tensor("adam.v", {n}, kernels::DType::F32, bytes_of(state.adam.v()));
  std::vector<uint8_t> file = w.to_bytes();
  const std::string checksum = checksum_of(file);
  std::memcpy(file.data() + kChecksumAt, checksum.data(), kChecksumDigits);
  rename_target(path, "checkpoint");  // refuses a device or FIFO: --resume reads the file back
  write_file_atomically(path, std::string_view(reinterpret_cast<const char*>(file.data()), file.size()));
}

void read_checkpoint(const std::string& path, const CheckpointKey& key, LoraParams<float>& lora,
                     TrainState& state) {
  const gguf::File f = gguf::File::open(path);
  if (f.get_string("general.type", "") != kType)
    throw InputError(fmt::format("{}: not a choreo finetune checkpoint", path));
  check_checksum(f, path);
  check_settings(f, path, key);
  const std::vector<float*> values = lora.values();
  const auto tensor = [&](const char* name) {
    const gguf::TensorInfo* t = f.tensor(name);
    if (!t || t->type != kernels::DType::F32 || t->n_elements() != int64_t(values.size()))
      throw InputError(
          fmt::format("{}: the checkpoint's {} is missing or has another size than the {} LoRA values", path,
                      name, values.size()));
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
  if (state.epochs_done < 0)
    throw InputError(fmt::format("{}: the checkpoint's epoch count is negative", path));
}

}  // namespace choreo::train
