#pragma once
// Byte-level BPE ("gpt2" vocabularies): pre-tokenize into words, map bytes to GPT-2's printable characters,
// then apply merges in rank order within each word.

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/model/pretokenizer.h"
#include "runtime/model/token_table.h"

namespace choreo::model {

/// Merge ranks keyed by the pair of token ids they join.
class MergeRanks {
 public:
  /// Records `left`+`right` with rank `rank`; a pair seen before keeps its first (lowest) rank.
  void add(int32_t left, int32_t right, int32_t rank) { ranks_.emplace(key(left, right), rank); }
  /// The rank of merging `left` and `right`, or -1 when they do not merge.
  int32_t find(int32_t left, int32_t right) const {
    const auto it = ranks_.find(key(left, right));
    return it == ranks_.end() ? -1 : it->second;
  }
  size_t size() const { return ranks_.size(); }

 private:
  static uint64_t key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  std::unordered_map<uint64_t, int32_t> ranks_;
};

/// Encodes text with byte-level BPE as llama.cpp's llm_tokenizer_bpe does.
class BpeTokenizer {
 public:
  BpeTokenizer(const TokenTable& table, MergeRanks ranks, PreTokenizer pre_tokenizer, bool ignore_merges);
  /// Appends the ids for `text` (which must not contain special tokens; the caller splits those off).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  size_t n_merges() const { return ranks_.size(); }

 private:
  void encode_word(std::string_view encoded_word, std::vector<int32_t>& out) const;

  const TokenTable& table_;
  MergeRanks ranks_;
  PreTokenizer pre_tokenizer_;
  bool ignore_merges_;
};

}  // namespace choreo::model
