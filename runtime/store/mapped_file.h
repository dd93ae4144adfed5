#pragma once
// A read-only memory map of a whole file: how store entries are read back.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace choreo::store {

/// A whole file mapped read-only; unmapped on destruction. An empty file maps to an empty span.
class MappedFile {
 public:
  /// Maps `path`; nullopt when it does not exist or cannot be opened or mapped.
  static std::optional<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_bytes_}; }

 private:
  MappedFile(const uint8_t* data, size_t size_bytes) : data_(data), size_bytes_(size_bytes) {}
  const uint8_t* data_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace choreo::store
