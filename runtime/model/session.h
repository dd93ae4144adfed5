#pragma once
// A plain KV-cache run over one token sequence: what `choreo generate` runs, and the reference every
// choreographed call is checked against.

#include <span>
#include <vector>

#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"

namespace choreo::model {

/// Appends tokens to one sequence, prefilling in micro-batches, and returns logits.
class Session {
 public:
  Session(const Model& model, kv::PagePool& pool, int max_batch = 512);

  /// Appends `tokens` at the next positions. Writes the last token's logits into `last_logits` (n_vocab
  /// floats), or every token's logits when `all_logits` is given (n_tokens * n_vocab floats).
  /// Throws InputError when the sequence would exceed the model's context length.
  void eval(std::span<const Token> tokens, std::vector<float>* last_logits,
            std::vector<float>* all_logits = nullptr);

  int n_past() const { return int(tokens_.size()); }
  const std::vector<Token>& tokens() const { return tokens_; }
  void reset();

 private:
  const Model& model_;
  kv::PageList pages_;
  int max_batch_;
  int n_ctx_;
  std::vector<Token> tokens_;
  Batch batch_;
  RunState state_;
};

}  // namespace choreo::model
