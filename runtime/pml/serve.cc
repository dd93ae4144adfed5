#include "runtime/pml/serve.h"

#include <fmt/format.h>

#include "common/clock.h"

namespace choreo::runtime::pml {

EncodedPrompt encode_prompt(const PrefillBatch& prefill, const EncodedSchema& encoded, const dsl::pml::Prompt& prompt,
                            const model::Model& model, bool closing_text,
                            const std::function<bool(kv::MessageId)>& alive) {
  EncodedPrompt out;
  out.plan = plan_prompt(encoded.layout, prompt, model);
  const auto fresh = [&](std::string label, const std::vector<model::Token>& tokens, int start_pos) {
    PrefillRequest r;
    r.tokens = tokens;
    r.parents = out.parents;  // everything before it in the prompt
    r.new_offset = start_pos;
    PromptPiece piece{std::move(label), tokens, start_pos, kv::kNoMessage, std::nullopt, steady_ms()};
    piece.encoded = prefill({r}).at(0);
    piece.id = piece.encoded->id;
    out.parents.push_back({piece.id, start_pos, int(tokens.size())});
    out.pieces.push_back(std::move(piece));
  };
  for (const PromptPart& part : out.plan.parts) {
    if (part.kind == PromptPart::Kind::Fresh) {
      fresh(part.label, part.tokens, part.start_pos);
      continue;
    }
    const kv::MessageId id = encoded.messages[size_t(part.piece)];
    if (id == kv::kNoMessage || (alive && !alive(id)))
      throw InputError(fmt::format("the encoding of '{}' is no longer in the cache", part.label),
                       "encode the schema again before serving prompts", prompt.where);
    out.pieces.push_back({part.label, part.tokens, part.start_pos, id, std::nullopt, steady_ms()});
    out.parents.push_back({id, part.start_pos, int(part.tokens.size())});
    out.n_cached_tokens += int(part.tokens.size());
  }
  if (closing_text && !out.plan.header.empty()) fresh("text", out.plan.header, out.plan.header_pos);
  return out;
}

ServeResult serve_prompt(Engine& engine, const EncodedSchema& encoded, const dsl::pml::Prompt& prompt,
                         const ServeOptions& options) {
  EncodedPrompt parts = encode_prompt(
      [&](std::vector<PrefillRequest> requests) { return engine.prefill_batch(requests); }, encoded, prompt,
      engine.model(), /*closing_text=*/false, [&](kv::MessageId id) { return engine.store().contains(id); });
  ServeResult out;
  out.n_cached_tokens = parts.n_cached_tokens;
  for (PromptPiece& piece : parts.pieces)
    if (piece.encoded) out.prefills.push_back(std::move(*piece.encoded));
  DecodeRequest d;
  d.header = parts.plan.header;
  d.parents = std::move(parts.parents);
  d.new_offset = parts.plan.header_pos;
  d.sampling = options.sampling;
  d.max_tokens = options.max_tokens;
  d.stop = options.stop;
  d.logprobs = options.logprobs;
  d.record_logits = options.record_logits;
  d.exact_tokens = options.exact_tokens;
  out.decode = engine.decode(d);
  out.plan = std::move(parts.plan);
  return out;
}

}  // namespace choreo::runtime::pml
