#pragma once
// The id <-> text table of a vocabulary with per-token scores and attributes, shared by both tokenizers.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace choreo::model {

/// Token attributes as bit flags, numbered like llama.cpp's llama_token_attr.
enum TokenAttr : uint8_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
};

/// Token texts, scores and attributes with a text -> id index. Not copyable: the index points into the texts.
struct TokenTable {
  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<uint8_t> attrs;
  std::unordered_map<std::string_view, int32_t> index;

  TokenTable() = default;
  TokenTable(const TokenTable&) = delete;
  TokenTable& operator=(const TokenTable&) = delete;

  int32_t size() const { return int32_t(texts.size()); }
  /// Id of the token whose text is exactly `text`, or -1.
  int32_t find(std::string_view text) const {
    const auto it = index.find(text);
    return it == index.end() ? -1 : it->second;
  }
  bool has(int32_t id, uint8_t attr_bits) const { return (attrs[size_t(id)] & attr_bits) != 0; }
};

}  // namespace choreo::model
