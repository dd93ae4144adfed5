#pragma once
// What the libFuzzer targets in tests/fuzz share (they cannot use the doctest helpers in tests/): line counts,
// the shared data, and the generator of deep and large inputs.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace choreo::fuzz {

// ---- deep and large inputs ----------------------------------------------------------------------------
// Inputs that stand for large ones: kExpandByte, two bytes of count, then five parts separated by
// kPartByte: head, open, middle, close, tail. They expand to head + open x n + middle + close x n + tail
// with n = count x 16 (up to ~10^6), as many as fit the target's byte cap. So a few bytes the fuzzer mutates
// reach nesting depths and sizes that -max_len never would: 100,000 brackets, a megabyte of text, many rows.

inline constexpr unsigned char kExpandByte = 0xFE;
inline constexpr char kPartByte = '\xFF';

/// One shape a target's generator writes: the five parts of an expandable input.
struct Shape {
  std::string_view head, open, middle, close, tail;
};

/// `data` itself, or its expansion when it is an expandable input (at most about `max_bytes`).
inline std::string expand(std::string_view data, size_t max_bytes) {
  if (data.size() < 3 || static_cast<unsigned char>(data[0]) != kExpandByte) return std::string(data);
  size_t count = (static_cast<unsigned char>(data[1]) | static_cast<size_t>(static_cast<unsigned char>(data[2])) << 8) * 16;
  std::string_view parts[5];
  std::string_view rest = data.substr(3);
  for (int i = 0; i < 5; ++i) {
    const size_t cut = i < 4 ? rest.find(kPartByte) : std::string_view::npos;
    parts[i] = rest.substr(0, cut);
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);
  }
  const size_t repeated = parts[1].size() + parts[3].size();
  if (repeated > 0 && count > max_bytes / repeated) count = max_bytes / repeated;
  std::string out(parts[0]);
  out.reserve(parts[0].size() + count * (parts[1].size() + parts[3].size()) + parts[2].size() + parts[4].size());
  for (size_t i = 0; i < count; ++i) out += parts[1];
  out += parts[2];
  for (size_t i = 0; i < count; ++i) out += parts[3];
  out += parts[4];
  return out;
}

/// The body of a target's LLVMFuzzerCustomMutator: one time in eight, replaces the input by an expandable
/// one with a shape from `shapes` and a random count; otherwise libFuzzer's own mutation.
inline size_t mutate(uint8_t* data, size_t size, size_t max_size, unsigned seed, std::initializer_list<Shape> shapes) {
  if (seed % 8 != 0 || shapes.size() == 0) return LLVMFuzzerMutate(data, size, max_size);
  const Shape& shape = shapes.begin()[(seed / 8) % shapes.size()];
  std::string input;
  input += static_cast<char>(kExpandByte);
  const unsigned count = ((seed >> 8) % 65536) >> ((seed >> 24) % 16);  // n = count x 16: 0 to ~10^6, often small
  input += static_cast<char>(count & 0xFF);
  input += static_cast<char>(count >> 8);
  for (std::string_view part : {shape.head, shape.open, shape.middle, shape.close, shape.tail}) {
    input += part;
    input += kPartByte;
  }
  input.pop_back();
  if (input.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, input.data(), input.size());
  return input.size();
}

/// Lines in a text (1 + newlines): the range an error's line must fall in.
inline int line_count(std::string_view text) {
  int n = 1;
  for (char c : text) n += c == '\n';
  return n;
}

/// The shared data: $CHOREO_SHARED, else $CHOREO_SOURCE_DIR/../shared (scripts/fuzz.sh sets both).
inline std::filesystem::path shared_dir() {
  if (const char* shared = std::getenv("CHOREO_SHARED")) return shared;
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  return std::filesystem::path(source ? source : ".") / ".." / "shared";
}

}  // namespace choreo::fuzz
