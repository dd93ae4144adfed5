// GGUF reader: every count, length and offset read from the file is checked against the bytes that remain
// before anything is allocated or dereferenced, so a hostile file can only ever produce an InputError.

#include "runtime/model/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>

#include "common/error.h"

namespace choreo::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian; big-endian hosts are unsupported");

namespace {

constexpr size_t kMaxDims = 4;

/// Smallest encoding of one value of `t` in bytes (strings: the 8-byte length; arrays: type + count).
size_t min_encoded_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    case ValueType::STRING:
      return 8;
    case ValueType::ARRAY:
      return 12;
  }
  return 1;
}

bool is_known_value_type(uint32_t id) { return id <= static_cast<uint32_t>(ValueType::FLOAT64); }

/// A read position in the file buffer; every read is bounds-checked and names what it was reading.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  size_t position() const { return position_; }
  size_t remaining() const { return bytes_.size() - position_; }

  [[noreturn]] void fail(const std::string& what, const std::string& hint = {}) const {
    throw InputError(fmt::format("{}: {}", name_, what), hint);
  }

  void need(size_t n_bytes, std::string_view what) const {
    if (n_bytes > remaining()) {
      fail(fmt::format("truncated file: {} at byte {} needs {} bytes but file has {} bytes", what, position_,
                       n_bytes, bytes_.size()));
    }
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }

  std::string read_string(std::string_view what) {
    uint64_t length = read<uint64_t>(what);
    if (length > remaining()) {
      fail(fmt::format("truncated or corrupt file: {} has length {} at byte {} but only {} bytes remain",
                       what, length, position_ - 8, remaining()));
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + position_), static_cast<size_t>(length));
    position_ += static_cast<size_t>(length);
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t position_ = 0;
};

/// Reads one scalar of type `t` into `out.scalar` (widened).
void read_scalar(Cursor& in, ValueType t, Value& out, std::string_view what) {
  switch (t) {
    case ValueType::UINT8:
      out.scalar = uint64_t{in.read<uint8_t>(what)};
      return;
    case ValueType::INT8:
      out.scalar = int64_t{in.read<int8_t>(what)};
      return;
    case ValueType::UINT16:
      out.scalar = uint64_t{in.read<uint16_t>(what)};
      return;
    case ValueType::INT16:
      out.scalar = int64_t{in.read<int16_t>(what)};
      return;
    case ValueType::UINT32:
      out.scalar = uint64_t{in.read<uint32_t>(what)};
      return;
    case ValueType::INT32:
      out.scalar = int64_t{in.read<int32_t>(what)};
      return;
    case ValueType::UINT64:
      out.scalar = in.read<uint64_t>(what);
      return;
    case ValueType::INT64:
      out.scalar = in.read<int64_t>(what);
      return;
    case ValueType::FLOAT32:
      out.scalar = double{in.read<float>(what)};
      return;
    case ValueType::FLOAT64:
      out.scalar = in.read<double>(what);
      return;
    case ValueType::BOOL: {
      uint8_t b = in.read<uint8_t>(what);
      if (b > 1) in.fail(fmt::format("{} is a bool with invalid byte value {} (expected 0 or 1)", what, b));
      out.scalar = b == 1;
      return;
    }
    case ValueType::STRING:
      out.scalar = in.read_string(what);
      return;
    case ValueType::ARRAY:
      break;
  }
  in.fail(fmt::format("{}: internal error reading scalar", what));
}

/// Reads one array element of scalar type `t` and appends it to the matching payload vector.
void read_array_element(Cursor& in, ValueType t, Value& out, std::string_view what) {
  switch (t) {
    case ValueType::UINT8:
      out.ints.push_back(in.read<uint8_t>(what));
      return;
    case ValueType::INT8:
      out.ints.push_back(in.read<int8_t>(what));
      return;
    case ValueType::UINT16:
      out.ints.push_back(in.read<uint16_t>(what));
      return;
    case ValueType::INT16:
      out.ints.push_back(in.read<int16_t>(what));
      return;
    case ValueType::UINT32:
      out.ints.push_back(in.read<uint32_t>(what));
      return;
    case ValueType::INT32:
      out.ints.push_back(in.read<int32_t>(what));
      return;
    // uint64 values above INT64_MAX keep their bits (two's complement) so a round trip is exact.
    case ValueType::UINT64:
      out.ints.push_back(static_cast<int64_t>(in.read<uint64_t>(what)));
      return;
    case ValueType::INT64:
      out.ints.push_back(in.read<int64_t>(what));
      return;
    case ValueType::FLOAT32:
      out.floats.push_back(in.read<float>(what));
      return;
    case ValueType::FLOAT64:
      out.floats.push_back(in.read<double>(what));
      return;
    case ValueType::BOOL: {
      uint8_t b = in.read<uint8_t>(what);
      if (b > 1)
        in.fail(fmt::format("{} contains a bool with invalid byte value {} (expected 0 or 1)", what, b));
      out.ints.push_back(b);
      return;
    }
    case ValueType::STRING:
      out.strings.push_back(in.read_string(what));
      return;
    case ValueType::ARRAY:
      break;
  }
  in.fail(fmt::format("{}: internal error reading array element", what));
}

void read_array(Cursor& in, Value& out, const std::string& key) {
  std::string what = fmt::format("array of metadata key '{}'", key);
  uint32_t elem_id = in.read<uint32_t>(what);
  if (!is_known_value_type(elem_id)) {
    in.fail(fmt::format("metadata key '{}' is an array with unknown element type {}", key, elem_id),
            "the file is corrupt or uses a GGUF extension newer than this reader");
  }
  out.elem_type = static_cast<ValueType>(elem_id);
  uint64_t count = in.read<uint64_t>(what);
  if (out.elem_type == ValueType::ARRAY) {
    if (count != 0)
      in.fail(
          fmt::format("metadata key '{}' is a nested array (array of arrays), which is not supported", key));
    return;
  }
  // Refuse counts the remaining bytes cannot possibly hold, before reserving anything.
  size_t min_bytes = min_encoded_bytes(out.elem_type);
  if (count > in.remaining() / min_bytes) {
    in.fail(fmt::format(
        "truncated or corrupt file: array of {} {} values for metadata key '{}' needs at least {} "
        "bytes each from byte {} but only {} bytes remain",
        count, value_type_name(out.elem_type), key, min_bytes, in.position(), in.remaining()));
  }
  size_t n = static_cast<size_t>(count);
  if (out.elem_type == ValueType::STRING) {
    out.strings.reserve(n);
  } else if (is_float_type(out.elem_type)) {
    out.floats.reserve(n);
  } else {
    out.ints.reserve(n);
  }
  for (size_t i = 0; i < n; ++i) read_array_element(in, out.elem_type, out, what);
}

int64_t checked_elements(Cursor& in, const std::string& tensor_name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      in.fail(fmt::format("tensor '{}' has absurd dimensions {}: the element count overflows 64 bits",
                          tensor_name, fmt::join(shape, " x ")));
    }
  }
  return n;
}

uint32_t read_header(Cursor& in, std::span<const uint8_t> bytes) {
  if (bytes.size() < 4 && (bytes.empty() || std::memcmp(bytes.data(), "GGUF", bytes.size()) == 0)) {
    in.fail(fmt::format("truncated file: {} bytes is too short for a GGUF header", bytes.size()));
  }
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "GGUF", 4) != 0) {
    std::string seen;
    for (size_t i = 0; i < std::min<size_t>(4, bytes.size()); ++i)
      seen += fmt::format("{}{:02x}", i ? " " : "", bytes[i]);
    in.fail(fmt::format("not a GGUF file: wrong magic (first bytes {}, expected 47 47 55 46 \"GGUF\")", seen),
            "is this a safetensors/PyTorch checkpoint? convert it with llama.cpp's convert_hf_to_gguf.py");
  }
  in.read<uint32_t>("magic");
  uint32_t version = in.read<uint32_t>("version");
  if (version == 1) {
    in.fail("GGUF version 1 is not supported (only versions 2 and 3 are)",
            "re-convert the model with a current llama.cpp");
  }
  if (version != 2 && version != 3) {
    std::string hint;
    uint32_t swapped = __builtin_bswap32(version);
    if (swapped == 2 || swapped == 3) hint = "this looks like a big-endian GGUF file, which is not supported";
    in.fail(fmt::format("unsupported GGUF version {} (only versions 2 and 3 are supported)", version), hint);
  }
  return version;
}

Value read_value(Cursor& in, const std::string& key) {
  uint32_t type_id = in.read<uint32_t>(fmt::format("type of metadata key '{}'", key));
  if (!is_known_value_type(type_id)) {
    in.fail(fmt::format("metadata key '{}' has unknown value type {}", key, type_id),
            "the file is corrupt or uses a GGUF extension newer than this reader");
  }
  Value value;
  value.type = static_cast<ValueType>(type_id);
  if (value.is_array()) {
    read_array(in, value, key);
  } else {
    read_scalar(in, value.type, value, fmt::format("value of metadata key '{}'", key));
  }
  return value;
}

size_t checked_alignment(Cursor& in, const Value& a) {
  uint64_t alignment = 0;
  if (!a.is_array() && is_integer_type(a.type)) {
    if (const auto* u = std::get_if<uint64_t>(&a.scalar)) alignment = *u;
    if (const auto* s = std::get_if<int64_t>(&a.scalar)) alignment = *s > 0 ? static_cast<uint64_t>(*s) : 0;
  }
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > (1u << 30)) {
    in.fail(fmt::format("general.alignment must be a power of two between 1 and 2^30, got {} ({})",
                        a.to_string(), a.is_array() ? "array" : value_type_name(a.type)));
  }
  return static_cast<size_t>(alignment);
}

TensorInfo read_tensor_info(Cursor& in, uint64_t index) {
  TensorInfo t;
  t.name = in.read_string(fmt::format("name of tensor {}", index));
  uint32_t n_dims = in.read<uint32_t>(fmt::format("dimension count of tensor '{}'", t.name));
  if (n_dims > kMaxDims) {
    in.fail(fmt::format("tensor '{}' has {} dimensions; at most {} are allowed", t.name, n_dims, kMaxDims));
  }
  for (uint32_t d = 0; d < n_dims; ++d) {
    t.shape.push_back(in.read<int64_t>(fmt::format("dimension {} of tensor '{}'", d, t.name)));
  }
  for (int64_t size : t.shape) {
    if (size <= 0) {
      in.fail(fmt::format("tensor '{}' has absurd dimensions {}: every dimension must be positive", t.name,
                          fmt::join(t.shape, " x ")));
    }
  }
  int64_t n_elements = checked_elements(in, t.name, t.shape);
  uint32_t type_id = in.read<uint32_t>(fmt::format("type of tensor '{}'", t.name));
  kernels::TypeTraits traits = kernels::type_traits(type_id);
  if (traits.block_elems == 0) {
    in.fail(fmt::format("tensor '{}' has unknown type id {}", t.name, type_id),
            "the file uses a ggml tensor type this reader does not know (newer llama.cpp?) or is corrupt");
  }
  t.type = static_cast<kernels::DType>(type_id);
  int64_t row_elements = t.shape.empty() ? 1 : t.shape[0];
  if (row_elements % traits.block_elems != 0) {
    in.fail(fmt::format("tensor '{}': row of {} elements is not a multiple of the {} block size {}", t.name,
                        row_elements, traits.name, traits.block_elems));
  }
  // n_elements < 2^63 and block_bytes < 2^9, so the product fits in 128 bits.
  unsigned __int128 n_bytes =
      static_cast<unsigned __int128>(n_elements / traits.block_elems) * traits.block_bytes;
  if (n_bytes > std::numeric_limits<uint64_t>::max() / 2) {
    in.fail(fmt::format("tensor '{}' has absurd dimensions {}: {} bytes of data", t.name,
                        fmt::join(t.shape, " x "), static_cast<double>(n_bytes)));
  }
  t.n_bytes = static_cast<size_t>(n_bytes);
  t.offset = in.read<uint64_t>(fmt::format("data offset of tensor '{}'", t.name));
  return t;
}

/// Checks every tensor's data lies aligned inside the file without overlapping another, and points it there.
void place_tensors(Cursor& in, std::span<const uint8_t> bytes, size_t data_start, size_t alignment,
                   std::vector<TensorInfo>& tensors) {
  if (data_start > bytes.size()) {
    in.fail(fmt::format("truncated file: tensor data section starts at byte {} but file has {} bytes",
                        data_start, bytes.size()));
  }
  uint64_t data_size = bytes.size() - data_start;
  for (TensorInfo& t : tensors) {
    if (t.offset % alignment != 0) {
      in.fail(fmt::format("tensor '{}' data offset {} is misaligned (not a multiple of the alignment {})",
                          t.name, t.offset, alignment));
    }
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      unsigned __int128 end = static_cast<unsigned __int128>(data_start) + t.offset + t.n_bytes;
      std::string end_text = end > std::numeric_limits<uint64_t>::max()
                                 ? std::string("beyond 2^64")
                                 : fmt::format("at byte {}", static_cast<uint64_t>(end));
      in.fail(fmt::format("truncated file: tensor '{}' data ends {} but file has {} bytes", t.name, end_text,
                          bytes.size()),
              "the download may be incomplete; compare the file size with the source");
    }
    t.data = bytes.data() + data_start + t.offset;
  }
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const TensorInfo& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& next = *by_offset[i];
    if (next.offset < prev.offset + prev.n_bytes) {
      in.fail(fmt::format("tensors '{}' (bytes {}..{} of the data section) and '{}' (from byte {}) overlap",
                          prev.name, prev.offset, prev.offset + prev.n_bytes, next.name, next.offset));
    }
  }
}

}  // namespace

// ---- File ---------------------------------------------------------------------------------------------

/// An mmap'ed region, unmapped on destruction.
struct File::Mapping {
  void* address = nullptr;
  size_t size_bytes = 0;
  ~Mapping() {
    if (address) munmap(address, size_bytes);
  }
};

File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::open(const std::string& path) {
  // O_NONBLOCK: a FIFO given as a model must not block the open (it is refused below).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    throw InputError(
        fmt::format("{}: cannot open: {}", path, std::strerror(err)),
        err == ENOENT ? "check the path, or run scripts/setup.sh to download the default model" : "");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("{}: {}, not a GGUF file", path, S_ISDIR(st.st_mode) ? "a directory" : "not a regular file"),
                     "give the path of a .gguf model file");
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->size_bytes = static_cast<size_t>(st.st_size);
  if (mapping->size_bytes == 0) {
    ::close(fd);
    throw InputError(fmt::format("{}: empty file (0 bytes), not a GGUF model", path));
  }
  void* address = mmap(nullptr, mapping->size_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (address == MAP_FAILED)
    throw RuntimeFailure(fmt::format("{}: mmap failed: {}", path, std::strerror(err)));
  mapping->address = address;

  File file = parse({static_cast<const uint8_t*>(address), mapping->size_bytes}, path);
  file.mapping_ = std::move(mapping);
  return file;
}

File File::parse(std::span<const uint8_t> bytes, std::string name) {
  File file;
  file.bytes_ = bytes;
  file.path_ = std::move(name);
  Cursor in(bytes, file.path_);

  file.version_ = read_header(in, bytes);
  uint64_t n_tensors = in.read<uint64_t>("tensor count");
  uint64_t n_kv = in.read<uint64_t>("metadata count");

  // Each metadata entry takes at least a key length, a type and one byte of value.
  if (n_kv > in.remaining() / 13) {
    in.fail(fmt::format("truncated or corrupt file: header says {} metadata entries but only {} bytes follow",
                        n_kv, in.remaining()));
  }
  file.kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = in.read_string(fmt::format("key of metadata entry {}", i));
    Value value = read_value(in, key);
    if (!file.kv_index_.emplace(key, file.kv_.size()).second) {
      in.fail(fmt::format("duplicate metadata key '{}'", key));
    }
    file.kv_.emplace_back(std::move(key), std::move(value));
  }
  if (const Value* a = file.find("general.alignment")) file.alignment_ = checked_alignment(in, *a);

  // Each tensor info takes at least a name length, n_dims, type and offset.
  if (n_tensors > in.remaining() / 24) {
    in.fail(fmt::format("truncated or corrupt file: header says {} tensors but only {} bytes follow",
                        n_tensors, in.remaining()));
  }
  file.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t = read_tensor_info(in, i);
    if (!file.tensor_index_.emplace(t.name, file.tensors_.size()).second) {
      in.fail(fmt::format("duplicate tensor name '{}'", t.name));
    }
    file.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment; a vocab-only file may end before it.
  size_t header_end = in.position();
  file.data_offset_ = header_end + (file.alignment_ - header_end % file.alignment_) % file.alignment_;
  if (!file.tensors_.empty()) place_tensors(in, bytes, file.data_offset_, file.alignment_, file.tensors_);
  return file;
}

}  // namespace choreo::gguf
