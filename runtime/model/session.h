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

  /// One decode step of several sessions of one model in one batch (parallel decode, as a server runs
  /// concurrent requests): appends tokens[i] to sessions[i] and writes every session's logits, n_vocab
  /// floats each, in order. Each session sees only its own tokens.
  static void decode_together(std::span<Session* const> sessions, std::span<const Token> tokens,
                              std::vector<float>* logits);

  /// Runs every later step with these LoRA adapters (lora.h), or on the base model when null (the default) or empty.
  /// The stack must outlive its use. Tokens already evaluated keep the KV they were computed with.
  void set_lora(const LoraStack* lora) { lora_ = lora; }

  int n_past() const { return int(tokens_.size()); }
  /// Pages held, including those kept past n_past by truncate().
  size_t pages_held() const { return pages_.pages().size(); }
  const std::vector<Token>& tokens() const { return tokens_; }
  void reset();
  /// Forgets every token from position n_tokens on (their pages are kept and later overwritten).
  void truncate(int n_tokens);
  /// Becomes the first `n_tokens` tokens of `other` (a session of the same model and pool layout), copying
  /// their KV pages: the same bytes it would hold after evaluating those tokens itself, since a token's KV
  /// depends only on the tokens before it (batch-invariant kernels). A server's prefix cache (choreo serve).
  void copy_prefix_from(const Session& other, int n_tokens);

 private:
  const Model& model_;
  kv::PageList pages_;
  int max_batch_;
  int n_ctx_;
  std::vector<Token> tokens_;
  const LoraStack* lora_ = nullptr;
  Batch batch_;
  RunState state_;
};

}  // namespace choreo::model
