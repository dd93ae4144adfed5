// libFuzzer target for the GGUF reader: any input must either parse or throw InputError, never crash, leak or
// read out of bounds. A file that parses is also written back with the Writer and re-read; the copy must have
// the same metadata and tensor bytes (a round-trip oracle for the writer).
// With CHOREO_FUZZ_SEED_DIR set, start-up first writes small writer-made seed files there (scripts/fuzz.sh).

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "common/error.h"
#include "runtime/model/gguf.h"
#include "runtime/model/synth.h"

namespace {

using choreo::gguf::File;

/// Reads every byte of every value and tensor so sanitizers see any bad pointer or length.
uint64_t touch_everything(const File& f) {
  uint64_t checksum = f.version() + f.alignment() + f.data_offset() + f.file_size();
  for (const auto& [key, value] : f.metadata()) {
    checksum += key.size() + value.to_string(SIZE_MAX).size() + value.array_size();
    if (f.find(key) != &value) __builtin_trap();
    // The typed getters must either answer or throw InputError.
    try {
      checksum += static_cast<uint64_t>(f.get_int(key, 0));
    } catch (const choreo::InputError&) {
    }
    try {
      checksum += static_cast<uint64_t>(f.get_float(key, 0) != 0);
    } catch (const choreo::InputError&) {
    }
    try {
      checksum += f.get_bool(key, false);
    } catch (const choreo::InputError&) {
    }
    try {
      checksum += f.get_string(key, "").size();
    } catch (const choreo::InputError&) {
    }
    try {
      checksum += f.get_string_array(key).size();
    } catch (const choreo::InputError&) {
    }
    try {
      checksum += f.get_float_array(key).size();
    } catch (const choreo::InputError&) {
    }
    try {
      checksum += f.get_int_array(key).size();
    } catch (const choreo::InputError&) {
    }
  }
  for (const auto& t : f.tensors()) {
    if (f.tensor(t.name) != &t) __builtin_trap();
    if (t.data == nullptr || t.n_elements() <= 0) __builtin_trap();
    for (size_t i = 0; i < t.n_bytes; ++i) checksum += t.data[i];
  }
  return checksum;
}

/// Writes the parsed file back out and checks the copy says the same thing.
void round_trip(const File& f) {
  choreo::gguf::Writer w(f.alignment());
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const auto& t : f.tensors()) {
    w.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  }
  std::vector<uint8_t> bytes = w.to_bytes();
  File copy = File::parse(bytes, "copy.gguf");  // must not throw: the writer only writes valid files
  if (copy.metadata().size() != f.metadata().size() || copy.tensors().size() != f.tensors().size())
    __builtin_trap();
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    const auto& [key, value] = f.metadata()[i];
    const auto& [copy_key, copy_value] = copy.metadata()[i];
    if (key != copy_key || value.type != copy_value.type ||
        value.to_string(SIZE_MAX) != copy_value.to_string(SIZE_MAX)) {
      __builtin_trap();
    }
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = f.tensors()[i];
    const auto& b = copy.tensors()[i];
    if (a.name != b.name || a.shape != b.shape || a.type != b.type || a.n_bytes != b.n_bytes ||
        std::memcmp(a.data, b.data, a.n_bytes) != 0) {
      __builtin_trap();
    }
  }
}

/// Small valid files covering every value type, several tensor types and alignments, and a whole model.
void write_seeds(const std::string& dir) {
  using choreo::gguf::Value;
  using choreo::gguf::ValueType;
  using choreo::kernels::DType;
  for (size_t alignment : {32, 1, 64}) {
    choreo::gguf::Writer w(alignment);
    for (uint32_t t = 0; t <= 12; ++t) {
      auto type = static_cast<ValueType>(t);
      Value v;
      v.type = type;
      if (type == ValueType::STRING) {
        v.scalar = std::string("text");
      } else if (type == ValueType::ARRAY) {
        v.elem_type = ValueType::STRING;
        v.strings = {"a", "b c"};
      } else if (type == ValueType::FLOAT32 || type == ValueType::FLOAT64) {
        v.scalar = 0.5;
      } else if (type == ValueType::BOOL) {
        v.scalar = true;
      } else {
        v.scalar = int64_t{7};
      }
      w.set("key." + std::to_string(t), v);
      if (type != ValueType::ARRAY && type != ValueType::STRING) {
        Value a;
        a.type = ValueType::ARRAY;
        a.elem_type = type;
        if (type == ValueType::FLOAT32 || type == ValueType::FLOAT64)
          a.floats = {1.0, 2.0};
        else
          a.ints = {1, 0, 1};
        w.set("array." + std::to_string(t), a);
      }
    }
    w.add_tensor("f32", {4, 2}, DType::F32, std::vector<uint8_t>(32, 1));
    w.add_tensor("q8_0", {32, 2}, DType::Q8_0, std::vector<uint8_t>(68, 2));
    w.add_tensor("q4_1", {32}, DType::Q4_1, std::vector<uint8_t>(20, 3));
    w.write(dir + "/writer_every_type_" + std::to_string(alignment) + ".gguf");
  }
  choreo::gguf::Writer vocab_only;
  vocab_only.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
  vocab_only.write(dir + "/writer_vocab_only.gguf");
  choreo::model::SynthShape tiny{.name = "fuzz-tiny",
                                 .embedding_length = 32,
                                 .block_count = 1,
                                 .head_count = 2,
                                 .head_count_kv = 1,
                                 .feed_forward_length = 64,
                                 .vocab_size = 300,
                                 .context_length = 64,
                                 .vocab = choreo::model::SynthVocab::Llama3,
                                 .rope_scaling_factor = 8.0};
  choreo::model::write_synthetic_model(tiny, DType::Q8_0, dir + "/synth_tiny_q8_0.gguf", 1);
  tiny.vocab = choreo::model::SynthVocab::ChatML;
  tiny.rope_scaling_factor = 0;
  choreo::model::write_synthetic_model(tiny, DType::Q4_0, dir + "/synth_tiny_q4_0.gguf", 2);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("CHOREO_FUZZ_SEED_DIR")) write_seeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    File f = File::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
    volatile uint64_t sink = touch_everything(f);
    (void)sink;
    round_trip(f);
  } catch (const choreo::InputError& e) {
    // Every rejection must name the file.
    if (std::strncmp(e.what(), "fuzz.gguf: ", 11) != 0) __builtin_trap();
  }
  return 0;
}
