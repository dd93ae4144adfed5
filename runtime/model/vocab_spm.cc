#include "runtime/model/vocab_spm.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/model/unicode.h"

namespace choreo::model {

SpmTokenizer::SpmTokenizer(const TokenTable& table, int32_t unknown_id)
    : table_(table), unknown_id_(unknown_id) {
  for (int byte = 0; byte < 256; ++byte) {
    int32_t id = table.find(fmt::format("<0x{:02X}>", byte));
    if (id < 0) id = table.find(std::string(1, char(byte)));
    byte_ids_[size_t(byte)] = id;
  }
}

namespace {

// A run of text that is (or will become) one token. Merged-away symbols keep length 0.
struct Symbol {
  uint32_t begin;
  uint32_t length;
  int32_t prev;
  int32_t next;
};

// A candidate merge of two neighbouring symbols into the token of their joined text.
struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t length;  // joined length when pushed; a later mismatch means a neighbour has changed
};

// Highest score first; among equal scores the leftmost pair, as SentencePiece does.
bool lower_priority(const Candidate& a, const Candidate& b) {
  return a.score < b.score || (a.score == b.score && a.left > b.left);
}

}  // namespace

void SpmTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const size_t length = std::min(utf8_sequence_length(uint8_t(text[offset])), text.size() - offset);
    const int32_t index = int32_t(symbols.size());
    symbols.push_back({uint32_t(offset), uint32_t(length), index - 1, -1});
    offset += length;
    if (offset < text.size()) symbols.back().next = index + 1;
  }

  std::vector<Candidate> heap;
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t length = symbols[size_t(left)].length + symbols[size_t(right)].length;
    const int32_t id = table_.find(text.substr(symbols[size_t(left)].begin, length));
    if (id < 0) return;
    heap.push_back({table_.scores[size_t(id)], left, right, length});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (int32_t i = 1; i < int32_t(symbols.size()); ++i) consider(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Candidate best = heap.back();
    heap.pop_back();
    Symbol& left = symbols[size_t(best.left)];
    Symbol& right = symbols[size_t(best.right)];
    if (left.length == 0 || right.length == 0 || left.length + right.length != best.length) continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = best.left;
    consider(left.prev, best.left);
    consider(best.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next) {
    const Symbol& symbol = symbols[size_t(i)];
    const std::string_view piece = text.substr(symbol.begin, symbol.length);
    const int32_t id = table_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (const char byte : piece) {
      const int32_t byte_id = byte_ids_[uint8_t(byte)];
      if (byte_id >= 0) {
        out.push_back(byte_id);
      } else if (unknown_id_ >= 0) {
        out.push_back(unknown_id_);
      }
    }
  }
}

}  // namespace choreo::model
