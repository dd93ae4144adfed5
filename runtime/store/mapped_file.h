#pragma once
// A read-only memory map of a whole file: how store entries are read back.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace choreo::store {

/// Why MappedFile::open mapped nothing.
enum class MapFailure {
  None,
  Missing,         // no such file
  NotRegularFile,  // a FIFO, symlink, directory, socket or device: never opened through, never followed
  Unreadable,      // could not be opened or mapped (permissions, I/O)
};

/// A whole file mapped read-only; unmapped on destruction. An empty file maps to an empty span.
class MappedFile {
 public:
  /// Maps `path` when it is a regular file (not a symlink to one); otherwise nullopt, with the reason in
  /// `failure` when given. Never blocks: whatever sits at `path` is looked at before it is opened, and
  /// opened with O_NONBLOCK | O_NOFOLLOW in case it was swapped meanwhile.
  static std::optional<MappedFile> open(const std::string& path, MapFailure* failure = nullptr);
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
