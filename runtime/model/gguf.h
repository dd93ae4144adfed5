#pragma once
// GGUF v2/v3 reader (memory-mapped, bounds-checked) and writer.
// Spec: ggml's docs/gguf.md. Every malformed input becomes an InputError naming the file and the problem.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kernels/dtype.h"

namespace choreo::gguf {

/// GGUF metadata value types, numbered as in the spec.
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);
/// The eight integer types (BOOL is not one).
bool is_integer_type(ValueType t);
/// FLOAT32 and FLOAT64.
bool is_float_type(ValueType t);

/// One metadata value. Scalars are widened (all integers to int64/uint64, floats to double);
/// the original type is kept in `type` (and `elem_type` for arrays).
struct Value {
  ValueType type = ValueType::UINT8;
  ValueType elem_type = ValueType::UINT8;  // for ARRAY
  std::variant<int64_t, uint64_t, double, bool, std::string> scalar;
  // ARRAY payloads: exactly one of these is filled according to elem_type
  // (integers -> ints, floats -> floats, bools -> ints, strings -> strings; nested arrays are rejected
  // with an error unless empty).
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  bool is_array() const { return type == ValueType::ARRAY; }
  size_t array_size() const;
  /// Short human-readable rendering for `model info` (arrays are abbreviated).
  std::string to_string(size_t max_items = 8) const;
};

/// Where a tensor lives in the file and what it is.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the innermost (contiguous) dimension
  kernels::DType type = kernels::DType::F32;
  uint64_t offset = 0;         // relative to the start of the data section
  size_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping
  int64_t n_elements() const;
};

/// A mapped GGUF file. Move-only; tensor data pointers stay valid while the File lives.
class File {
 public:
  /// Opens and validates `path`. Throws InputError("<path>: <what is wrong>") on any malformed input.
  static File open(const std::string& path);
  /// Parses an in-memory buffer (used by the fuzzer and tests); `name` appears in error messages.
  /// The buffer must outlive the File.
  static File parse(std::span<const uint8_t> bytes, std::string name);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  size_t file_size() const { return bytes_.size(); }
  /// The whole file as mapped (or parsed).
  std::span<const uint8_t> bytes() const { return bytes_; }
  /// Absolute byte offset where the tensor data section starts (TensorInfo::offset is relative to it).
  size_t data_offset() const { return data_offset_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  /// Typed getters: return `fallback` when absent; throw InputError when present with an incompatible type.
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key, std::string fallback) const;
  /// Required variants: throw InputError naming the key when absent.
  int64_t require_int(std::string_view key) const;
  std::string require_string(std::string_view key) const;
  /// Arrays: empty when absent; throw InputError when present with another element type.
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  const std::vector<double>& get_float_array(std::string_view key) const;
  const std::vector<int64_t>& get_int_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;

 private:
  File() = default;
  struct Mapping;
  std::unique_ptr<Mapping> mapping_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

/// Builds a GGUF v3 file: metadata in insertion order, tensors aligned to `alignment`.
/// Writes crash-safely (temporary file, fsync, rename), or a FIFO or character device in place.
class Writer {
 public:
  explicit Writer(size_t alignment = 32) : alignment_(alignment) {}
  void set(std::string key, Value value);
  void set_u32(std::string key, uint32_t v);
  void set_i32(std::string key, int32_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_f32_array(std::string key, std::vector<float> v);
  void set_i32_array(std::string key, std::vector<int32_t> v);
  /// `data` must hold exactly row_bytes(type, shape[0]) * product(shape[1:]) bytes.
  void add_tensor(std::string name, std::vector<int64_t> shape, kernels::DType type, std::vector<uint8_t> data);
  /// Streaming form for large files (e.g. an 8B synthetic model): `fill` is called once, at write time,
  /// with a buffer of exactly the tensor's size, so the whole model never sits in memory.
  using Fill = std::function<void(std::span<uint8_t>)>;
  void add_tensor(std::string name, std::vector<int64_t> shape, kernels::DType type, Fill fill);
  /// Serialises the whole file to memory (tests, fuzz seeds).
  std::vector<uint8_t> to_bytes() const;
  void write(const std::string& path) const;

 private:
  size_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> shape;
    kernels::DType type;
    Fill fill;
  };
  std::vector<PendingTensor> tensors_;
};

}  // namespace choreo::gguf
