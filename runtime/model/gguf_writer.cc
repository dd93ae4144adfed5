// GGUF v3 writer. The header is serialised to memory; tensor bytes are produced by each tensor's Fill
// straight into a shared mapping of the (preallocated) temporary file, so even an 8B-parameter model is never
// held in the heap. The file appears under its final name only after fsync + rename.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/model/gguf.h"

namespace choreo::gguf {

namespace {

constexpr size_t kDefaultAlignment = 32;

/// Appends little-endian encodings to a byte vector.
class ByteSink {
 public:
  std::vector<uint8_t> bytes;

  template <typename T>
  void put(T value) {
    append(&value, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }

 private:
  // resize + memcpy rather than vector::insert, which trips GCC 12's bogus -Wstringop-overflow at -O3.
  void append(const void* data, size_t n_bytes) {
    if (n_bytes == 0) return;
    size_t at = bytes.size();
    bytes.resize(at + n_bytes);
    std::memcpy(bytes.data() + at, data, n_bytes);
  }
};

int64_t scalar_as_int(const Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v.scalar)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) return static_cast<int64_t>(*u);
  if (const auto* d = std::get_if<double>(&v.scalar)) {
    // A float given for an integer type: convert only when representable (the cast is undefined otherwise).
    if (!(*d >= -0x1p63 && *d < 0x1p63)) {
      throw std::invalid_argument("gguf::Writer: float value out of range for an integer metadata type");
    }
    return static_cast<int64_t>(*d);
  }
  if (const auto* b = std::get_if<bool>(&v.scalar)) return *b ? 1 : 0;
  throw std::invalid_argument("gguf::Writer: string value given for a numeric metadata type");
}

double scalar_as_double(const Value& v) {
  if (const auto* d = std::get_if<double>(&v.scalar)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v.scalar)) return static_cast<double>(*u);
  return static_cast<double>(scalar_as_int(v));
}

/// Writes one value of scalar type `t`; `i` and `d` carry it as integer or floating point.
void put_number(ByteSink& out, ValueType t, int64_t i, double d) {
  switch (t) {
    case ValueType::UINT8:
      out.put(static_cast<uint8_t>(i));
      return;
    case ValueType::INT8:
      out.put(static_cast<int8_t>(i));
      return;
    case ValueType::UINT16:
      out.put(static_cast<uint16_t>(i));
      return;
    case ValueType::INT16:
      out.put(static_cast<int16_t>(i));
      return;
    case ValueType::UINT32:
      out.put(static_cast<uint32_t>(i));
      return;
    case ValueType::INT32:
      out.put(static_cast<int32_t>(i));
      return;
    case ValueType::UINT64:
      out.put(static_cast<uint64_t>(i));
      return;
    case ValueType::INT64:
      out.put(i);
      return;
    case ValueType::FLOAT32:
      out.put(static_cast<float>(d));
      return;
    case ValueType::FLOAT64:
      out.put(d);
      return;
    case ValueType::BOOL:
      out.put(static_cast<uint8_t>(i != 0));
      return;
    case ValueType::STRING:
    case ValueType::ARRAY:
      break;
  }
  throw std::invalid_argument("gguf::Writer: not a numeric type");
}

void put_value(ByteSink& out, const Value& v) {
  out.put(static_cast<uint32_t>(v.type));
  if (v.type == ValueType::STRING) {
    out.put_string(std::get<std::string>(v.scalar));
    return;
  }
  if (!v.is_array()) {
    if (v.type == ValueType::FLOAT32 || v.type == ValueType::FLOAT64) {
      put_number(out, v.type, 0, scalar_as_double(v));
    } else {
      put_number(out, v.type, scalar_as_int(v), 0.0);
    }
    return;
  }
  out.put(static_cast<uint32_t>(v.elem_type));
  out.put<uint64_t>(v.array_size());
  if (v.elem_type == ValueType::STRING) {
    for (const std::string& s : v.strings) out.put_string(s);
  } else if (v.elem_type == ValueType::FLOAT32 || v.elem_type == ValueType::FLOAT64) {
    for (double d : v.floats) put_number(out, v.elem_type, 0, d);
  } else if (v.elem_type == ValueType::ARRAY) {
    // Only empty nested arrays exist (the reader rejects others); array_size() is 0.
  } else {
    for (int64_t i : v.ints) put_number(out, v.elem_type, i, 0.0);
  }
}

size_t align_up(size_t n, size_t alignment) { return n + (alignment - n % alignment) % alignment; }

void check_alignment(uint64_t alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > (1u << 30)) {
    throw std::invalid_argument(
        fmt::format("gguf::Writer: alignment {} is not a power of two <= 2^30", alignment));
  }
}

/// Where everything goes in the output: the serialised header and each tensor's absolute byte range.
struct Layout {
  std::vector<uint8_t> header;
  std::vector<size_t> tensor_start;  // absolute offsets
  std::vector<size_t> tensor_bytes;
  size_t total_bytes = 0;
};

size_t tensor_size(const std::vector<int64_t>& shape, kernels::DType type) {
  int64_t rows = 1;
  for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
  return kernels::row_bytes(type, shape.empty() ? 1 : shape[0]) * static_cast<size_t>(rows);
}

[[noreturn]] void io_failure(const std::string& what, const std::string& path, int err) {
  throw RuntimeFailure(fmt::format("{}: {}: {}", path, what, std::strerror(err)));
}

}  // namespace

void Writer::set(std::string key, Value value) {
  if (key == "general.alignment") {
    uint64_t a =
        value.is_array() || value.type == ValueType::STRING ? 0 : static_cast<uint64_t>(scalar_as_int(value));
    check_alignment(a);
    alignment_ = static_cast<size_t>(a);
  }
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

void Writer::set_u32(std::string key, uint32_t v) {
  Value value;
  value.type = ValueType::UINT32;
  value.scalar = uint64_t{v};
  set(std::move(key), std::move(value));
}

void Writer::set_i32(std::string key, int32_t v) {
  Value value;
  value.type = ValueType::INT32;
  value.scalar = int64_t{v};
  set(std::move(key), std::move(value));
}

void Writer::set_f32(std::string key, float v) {
  Value value;
  value.type = ValueType::FLOAT32;
  value.scalar = double{v};
  set(std::move(key), std::move(value));
}

void Writer::set_bool(std::string key, bool v) {
  Value value;
  value.type = ValueType::BOOL;
  value.scalar = v;
  set(std::move(key), std::move(value));
}

void Writer::set_string(std::string key, std::string v) {
  Value value;
  value.type = ValueType::STRING;
  value.scalar = std::move(v);
  set(std::move(key), std::move(value));
}

void Writer::set_string_array(std::string key, std::vector<std::string> v) {
  Value value;
  value.type = ValueType::ARRAY;
  value.elem_type = ValueType::STRING;
  value.strings = std::move(v);
  set(std::move(key), std::move(value));
}

void Writer::set_f32_array(std::string key, std::vector<float> v) {
  Value value;
  value.type = ValueType::ARRAY;
  value.elem_type = ValueType::FLOAT32;
  value.floats.assign(v.begin(), v.end());
  set(std::move(key), std::move(value));
}

void Writer::set_i32_array(std::string key, std::vector<int32_t> v) {
  Value value;
  value.type = ValueType::ARRAY;
  value.elem_type = ValueType::INT32;
  value.ints.assign(v.begin(), v.end());
  set(std::move(key), std::move(value));
}

void Writer::add_tensor(std::string name, std::vector<int64_t> shape, kernels::DType type,
                        std::vector<uint8_t> data) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(data));
  // Validate the shape first so the size comparison below is meaningful.
  add_tensor(name, std::move(shape), type,
             [shared](std::span<uint8_t> out) { std::memcpy(out.data(), shared->data(), out.size()); });
  size_t expected = tensor_size(tensors_.back().shape, type);
  if (shared->size() != expected) {
    tensors_.pop_back();
    throw std::invalid_argument(fmt::format("gguf::Writer: tensor '{}' needs {} bytes of {} data, got {}",
                                            name, expected, kernels::type_traits(type).name, shared->size()));
  }
}

void Writer::add_tensor(std::string name, std::vector<int64_t> shape, kernels::DType type, Fill fill) {
  kernels::TypeTraits traits = kernels::type_traits(type);
  if (traits.block_elems == 0)
    throw std::invalid_argument(fmt::format("gguf::Writer: tensor '{}' has unknown type", name));
  if (shape.size() > 4)
    throw std::invalid_argument(fmt::format("gguf::Writer: tensor '{}' has > 4 dimensions", name));
  for (int64_t d : shape) {
    if (d <= 0)
      throw std::invalid_argument(
          fmt::format("gguf::Writer: tensor '{}' has a non-positive dimension", name));
  }
  if ((shape.empty() ? 1 : shape[0]) % traits.block_elems != 0) {
    throw std::invalid_argument(
        fmt::format("gguf::Writer: tensor '{}' rows are not a multiple of the {} block size {}", name,
                    traits.name, traits.block_elems));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) throw std::invalid_argument(fmt::format("gguf::Writer: duplicate tensor '{}'", name));
  }
  tensors_.push_back({std::move(name), std::move(shape), type, std::move(fill)});
}

namespace {

Layout make_layout(const std::vector<std::pair<std::string, Value>>& kv, size_t alignment,
                   const auto& tensors) {
  check_alignment(alignment);
  Layout layout;
  ByteSink out;
  out.put<uint32_t>(0x46554747);  // "GGUF" read as a little-endian uint32
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors.size());
  bool write_alignment = alignment != kDefaultAlignment;
  bool has_alignment_key = false;
  for (const auto& [key, value] : kv) has_alignment_key |= key == "general.alignment";
  out.put<uint64_t>(kv.size() + (write_alignment && !has_alignment_key ? 1 : 0));
  for (const auto& [key, value] : kv) {
    out.put_string(key);
    put_value(out, value);
  }
  if (write_alignment && !has_alignment_key) {
    out.put_string("general.alignment");
    out.put(static_cast<uint32_t>(ValueType::UINT32));
    out.put(static_cast<uint32_t>(alignment));
  }
  size_t data_offset = 0;
  for (const auto& t : tensors) {
    size_t n_bytes = tensor_size(t.shape, t.type);
    out.put_string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) out.put<int64_t>(d);
    out.put(static_cast<uint32_t>(t.type));
    out.put<uint64_t>(data_offset);
    layout.tensor_start.push_back(data_offset);
    layout.tensor_bytes.push_back(n_bytes);
    data_offset = align_up(data_offset + n_bytes, alignment);
  }
  size_t data_start = tensors.empty() ? out.bytes.size() : align_up(out.bytes.size(), alignment);
  for (size_t& start : layout.tensor_start) start += data_start;
  layout.total_bytes = tensors.empty() ? data_start : layout.tensor_start.back() + layout.tensor_bytes.back();
  layout.header = std::move(out.bytes);
  return layout;
}

/// A FIFO or character device is written in place, in file order, one tensor in memory at a time (it
/// cannot be mapped or replaced).
void write_in_place(const std::string& path, const Layout& layout, const auto& tensors) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) io_failure("opening", path, errno);
  const auto put = [&](std::span<const uint8_t> bytes) {
    if (!write_all(fd, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()))) {
      const int err = errno;
      ::close(fd);
      io_failure("write failed", path, err);
    }
  };
  put(layout.header);
  size_t at = layout.header.size();
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buffer.assign(layout.tensor_start[i] - at, 0);  // the alignment padding before the tensor
    put(buffer);
    buffer.assign(layout.tensor_bytes[i], 0);
    try {
      tensors[i].fill(buffer);
    } catch (...) {
      ::close(fd);
      throw;
    }
    put(buffer);
    at = layout.tensor_start[i] + layout.tensor_bytes[i];
  }
  if (::close(fd) != 0) io_failure("write failed", path, errno);
}

}  // namespace

std::vector<uint8_t> Writer::to_bytes() const {
  Layout layout = make_layout(kv_, alignment_, tensors_);
  std::vector<uint8_t> bytes(layout.total_bytes, 0);
  std::memcpy(bytes.data(), layout.header.data(), layout.header.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensors_[i].fill(std::span<uint8_t>(bytes.data() + layout.tensor_start[i], layout.tensor_bytes[i]));
  }
  return bytes;
}

void Writer::write(const std::string& output) const {
  Layout layout = make_layout(kv_, alignment_, tensors_);
  // A missing or read-only directory is the user's to fix (exit 2). A FIFO or character device is written in
  // place (docs/limits.md, "Output files"); a file is written beside its final place and renamed there, so a
  // symlink's target is replaced.
  if (check_writable(output, "-o")) return write_in_place(output, layout, tensors_);
  const std::string path = rename_target(output, "-o");
  TemporaryFile temp(path, /*read_write=*/true);  // mapped below, so opened for reading too
  // Reserve the space up front: running out of disk later, inside a mapping, would be a SIGBUS.
  if (int err = posix_fallocate(temp.fd(), 0, static_cast<off_t>(layout.total_bytes)); err != 0) {
    io_failure(fmt::format("cannot reserve {} bytes", layout.total_bytes), path, err);
  }
  if (!write_all(temp.fd(), std::string_view(reinterpret_cast<const char*>(layout.header.data()), layout.header.size())))
    io_failure("write failed", path, errno);
  // Each tensor is filled through its own shared mapping, unmapped as soon as it is done, so the process
  // holds at most one tensor; writeback of the finished range starts right away.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const size_t map_start = layout.tensor_start[i] / page * page;
    const size_t map_bytes = layout.tensor_start[i] + layout.tensor_bytes[i] - map_start;
    void* address =
        mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, temp.fd(), static_cast<off_t>(map_start));
    if (address == MAP_FAILED) io_failure("mmap of output failed", path, errno);
    try {
      tensors_[i].fill(std::span<uint8_t>(
          static_cast<uint8_t*>(address) + (layout.tensor_start[i] - map_start), layout.tensor_bytes[i]));
    } catch (...) {
      munmap(address, map_bytes);
      throw;
    }
    munmap(address, map_bytes);
    sync_file_range(temp.fd(), static_cast<off_t>(map_start), static_cast<off_t>(map_bytes),
                    SYNC_FILE_RANGE_WRITE);
  }
  temp.commit();
}

}  // namespace choreo::gguf
