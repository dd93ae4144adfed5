#include "runtime/model/vocab_bpe.h"

#include <algorithm>
#include <string>

#include "runtime/model/unicode.h"

namespace choreo::model {

BpeTokenizer::BpeTokenizer(const TokenTable& table, MergeRanks ranks, PreTokenizer pre_tokenizer,
                           bool ignore_merges)
    : table_(table),
      ranks_(std::move(ranks)),
      pre_tokenizer_(std::move(pre_tokenizer)),
      ignore_merges_(ignore_merges) {}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::string encoded;
  for (const std::string_view word : pre_tokenizer_.split(text)) {
    encoded.clear();
    for (const char byte : word) encoded += byte_to_unicode(uint8_t(byte));
    if (ignore_merges_) {
      const int32_t whole = table_.find(encoded);
      if (whole >= 0) {
        out.push_back(whole);
        continue;
      }
    }
    encode_word(encoded, out);
  }
}

namespace {

// A run of the word that is (or will become) one token; id is -1 when the run is not a token.
struct Symbol {
  uint32_t begin;
  uint32_t length;
  int32_t prev;
  int32_t next;
  int32_t id;
};

// A merge of two neighbouring symbols, valid while both still hold the tokens it was computed for.
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t left_id;
  int32_t right_id;
};

// Lowest rank first; among equal ranks the leftmost pair.
bool lower_priority(const Candidate& a, const Candidate& b) {
  return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

}  // namespace

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < word.size();) {
    const size_t length = std::min(utf8_sequence_length(uint8_t(word[offset])), word.size() - offset);
    const int32_t index = int32_t(symbols.size());
    symbols.push_back(
        {uint32_t(offset), uint32_t(length), index - 1, -1, table_.find(word.substr(offset, length))});
    offset += length;
    if (offset < word.size()) symbols.back().next = index + 1;
  }

  std::vector<Candidate> heap;
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = symbols[size_t(left)].id;
    const int32_t right_id = symbols[size_t(right)].id;
    if (left_id < 0 || right_id < 0) return;
    const int32_t rank = ranks_.find(left_id, right_id);
    if (rank < 0) return;
    heap.push_back({rank, left, right, left_id, right_id});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (int32_t i = 1; i < int32_t(symbols.size()); ++i) consider(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Candidate best = heap.back();
    heap.pop_back();
    Symbol& left = symbols[size_t(best.left)];
    Symbol& right = symbols[size_t(best.right)];
    if (left.length == 0 || right.length == 0 || left.id != best.left_id || right.id != best.right_id)
      continue;
    left.length += right.length;
    left.id = table_.find(word.substr(left.begin, left.length));
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = best.left;
    consider(left.prev, best.left);
    consider(best.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next) {
    const Symbol& symbol = symbols[size_t(i)];
    if (symbol.id >= 0) {
      out.push_back(symbol.id);
      continue;
    }
    // llama.cpp's fallback: look up each byte of the encoded text on its own (only ASCII can match).
    for (const char byte : word.substr(symbol.begin, symbol.length)) {
      const int32_t id = table_.find(std::string_view(&byte, 1));
      if (id >= 0) out.push_back(id);
    }
  }
}

}  // namespace choreo::model
