#pragma once
// Tokenizers built from a GGUF vocabulary: SentencePiece-style (tokenizer.ggml.model = "llama") and
// byte-level BPE ("gpt2") with the model's pre-tokenizer (tokenizer.ggml.pre), matching llama.cpp.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/token.h"
#include "runtime/model/gguf.h"

namespace choreo::model {

using Token = choreo::Token;

/// The vocabulary of a model and the tokenizer it implies.
class Vocab {
 public:
  enum class Kind { SPM, BPE };

  /// Builds from GGUF metadata (tokenizer.ggml.*). Throws InputError for a missing or inconsistent vocab
  /// (e.g. scores/types arrays of the wrong length, ids out of range, unknown tokenizer model).
  static Vocab from_gguf(const gguf::File& file);

  Vocab(Vocab&&) noexcept;
  Vocab& operator=(Vocab&&) noexcept;
  ~Vocab();

  Kind kind() const;
  int n_tokens() const;
  /// Text -> ids. `add_special` adds BOS (and EOS) as the vocab's add_bos/add_eos flags say;
  /// `parse_special` recognises control tokens such as "<|im_start|>" written in the text.
  std::vector<Token> tokenize(std::string_view text, bool add_special, bool parse_special = false) const;
  /// A lower bound on tokenize(text, false, parse_special).size() from the bytes alone, in one pass and
  /// without allocating: no token stands for more than longest_token_bytes() bytes of text (its spelling in
  /// the vocabulary is never shorter than what it stands for), and every byte the vocabulary cannot drop is
  /// counted. Lets a caller refuse a text that cannot fit a context before tokenising it.
  size_t min_tokens(std::string_view text) const;
  /// The longest token's spelling in the vocabulary, in bytes.
  size_t longest_token_bytes() const;
  /// The bytes one token stands for (byte tokens <0xAB> become the byte; SPM's U+2581 becomes a space).
  /// Control tokens render as their text only when `special` is true.
  std::string token_to_piece(Token id, bool special = false) const;
  /// Concatenation of pieces; round-trips bytes for any text that tokenize() produced.
  /// SPM leading-space rule: tokenize() (with add_space_prefix, the SPM default) puts a space before the
  /// text and before any text that follows a special token, as llama.cpp does; detokenize() drops one
  /// leading space from the first piece at the start and after each control/user-defined/unknown token.
  /// So detokenize(tokenize(s, add_special)) == s, except that SPM writes spaces as U+2581, so a U+2581
  /// in `s` comes back as a space. Unlike llama.cpp, BPE output is not "cleaned" (no space removal
  /// before punctuation), so bytes round-trip, provided the vocab has a token for each byte of `s`: as in
  /// llama.cpp, a byte it lacks is dropped (the refact vocabulary has no token for 0xF1).
  std::string detokenize(std::span<const Token> ids, bool special = false) const;
  const std::string& token_text(Token id) const;  // raw vocab string

  Token bos() const;  // -1 when the vocab has none
  Token eos() const;
  /// End-of-turn: tokenizer.ggml.eot_token_id, else the first of llama.cpp's EOT texts present in the
  /// vocabulary in list order (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, ...); -1 when
  /// none.
  Token eot() const;
  bool add_bos() const;
  bool add_eos() const;
  /// End of generation: EOS, EOT or any token the vocab marks as such.
  bool is_eog(Token id) const;
  bool is_control(Token id) const;
  /// -1 when `text` is not a single token.
  Token find(std::string_view text) const;

 private:
  Vocab();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace choreo::model
