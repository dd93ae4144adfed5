#pragma once
// Mode::Naive, the plain chat-API baseline (runtime/engine/mode.h). Mode::Prefix extends it with prefix reuse
// (mode_prefix.cc).

#include "runtime/engine/mode.h"

namespace choreo::runtime {

/// A decode re-encodes its whole prompt as a chat API call would: BOS + its parents' tokens in list order +
/// its header, one flat sequence. Its result names a text-only message holding what the call produced (header
/// + generated), so a later call that lists it as a parent re-encodes exactly that text. Prefills are kept as
/// text only.
class NaiveMode : public CallMode {
 public:
  explicit NaiveMode(ModeContext context) : context_(context) {}

  bool encodes_prefills() const override { return false; }
  DecodeLayout lay_out_decode(const DecodeRequest& request, size_t index, int budget) final;
  void finish_decode(const DecodeRequest& request, const DecodeLayout& layout,
                     std::span<const model::Token> generated) override;

 protected:
  /// The start of a flat prompt whose encoding exists already: pieces of earlier messages, each a parent
  /// placed where its tokens sit in the flat sequence.
  struct ReusedPrefix {
    std::vector<Parent> chunks;
    int n_tokens = 0;  // tokens the chunks cover, from the start of the flat prompt
  };
  /// What of `flat` (the call's prompt, BOS excluded) this mode attends to instead of recomputing; it leaves
  /// at least the last token to compute. Naive mode reuses nothing.
  virtual ReusedPrefix reusable_prefix(const DecodeRequest& request, std::span<const model::Token> flat) {
    return {};
  }

  const ModeContext& context() const { return context_; }

 private:
  ModeContext context_;
};

}  // namespace choreo::runtime
