// Mode::Prefix: the chat-API baseline with vLLM/SGLang-style prefix caching. A decode's flat prompt is laid
// out as in naive mode (mode_naive.h), but its longest token prefix in common with an earlier call's flat
// sequence (prompt + generated) is attended to where that call encoded it instead of being recomputed.

#include <algorithm>

#include "runtime/engine/mode_naive.h"

namespace choreo::runtime {

namespace {

class PrefixMode final : public NaiveMode {
 public:
  using NaiveMode::NaiveMode;

  void finish_decode(const DecodeRequest& request, const DecodeLayout& layout,
                     std::span<const model::Token> generated) override {
    // The call's whole flat sequence, as the chunks that encode it: the reused prefix, then its own message.
    Sequence s;
    s.scope = request.prefix_scope;
    s.model = request.model;
    for (const PlacedView& v : layout.views) {
      const kv::Message& p = context().store.get(v.message);
      s.tokens.insert(s.tokens.end(), p.tokens.begin(), p.tokens.begin() + v.n_tokens);
      s.chunks.push_back({v.message, v.n_tokens});
    }
    const kv::Message& own = *layout.encoded;
    s.tokens.insert(s.tokens.end(), own.tokens.begin(), own.tokens.end());
    s.chunks.push_back({own.id, int(own.tokens.size())});
    sequences_.push_back(std::move(s));
    NaiveMode::finish_decode(request, layout, generated);
  }

  void forget(kv::MessageId id) override {
    // Sequences that run through this message can no longer be reused.
    std::erase_if(sequences_, [id](const Sequence& s) {
      return std::any_of(s.chunks.begin(), s.chunks.end(), [id](const auto& c) { return c.first == id; });
    });
  }

 protected:
  ReusedPrefix reusable_prefix(const DecodeRequest& request, std::span<const model::Token> flat) override {
    // The longest common token prefix with any earlier sequence of the call's scope and model (the first one
    // found on ties), leaving one token to compute.
    const Sequence* best = nullptr;
    int best_len = 0;
    for (const Sequence& s : sequences_) {
      if (s.scope != request.prefix_scope || s.model != request.model) continue;
      int l = 0;
      const int limit = std::min<int>(int(s.tokens.size()), int(flat.size()) - 1);
      while (l < limit && s.tokens[l] == flat[l]) ++l;
      if (l > best_len) best_len = l, best = &s;
    }
    ReusedPrefix prefix;
    prefix.n_tokens = best_len;
    if (!best) return prefix;
    int covered = 0;
    for (auto [id, len] : best->chunks) {
      if (covered >= best_len) break;
      const int take = std::min(len, best_len - covered);
      prefix.chunks.push_back({id, context().first_pos + covered, take});
      covered += take;
    }
    return prefix;
  }

 private:
  /// A flat sequence encoded so far, as a chain of (message, tokens) chunks.
  struct Sequence {
    uint64_t scope = 0;  // DecodeRequest::prefix_scope
    int model = 0;       // DecodeRequest::model: the model that encoded it
    std::vector<model::Token> tokens;
    std::vector<std::pair<kv::MessageId, int>> chunks;
  };
  std::vector<Sequence> sequences_;
};

}  // namespace

std::unique_ptr<CallMode> make_prefix_mode(ModeContext context) {
  return std::make_unique<PrefixMode>(context);
}

}  // namespace choreo::runtime
