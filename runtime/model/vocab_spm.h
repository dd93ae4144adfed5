#pragma once
// SentencePiece-style tokenization ("llama" vocabularies): merges chosen by highest token score, with byte
// fallback (<0xXX>) for characters the vocabulary lacks.

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/model/token_table.h"

namespace choreo::model {

/// Encodes text with the SentencePiece BPE-by-score algorithm as llama.cpp runs it.
class SpmTokenizer {
 public:
  /// `unknown_id` (or -1) stands in for a byte that has neither a <0xXX> nor a one-byte token.
  SpmTokenizer(const TokenTable& table, int32_t unknown_id);
  /// Appends the ids for `text`, whose spaces the caller has already escaped as U+2581.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  /// Whether `byte` always becomes part of some token: it has a byte token, or the unknown token stands in.
  bool always_tokenised(uint8_t byte) const { return byte_ids_[byte] >= 0 || unknown_id_ >= 0; }

 private:
  const TokenTable& table_;
  int32_t unknown_id_;
  std::array<int32_t, 256> byte_ids_;
};

}  // namespace choreo::model
