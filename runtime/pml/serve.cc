#include "runtime/pml/serve.h"

#include <fmt/format.h>

namespace choreo::runtime::pml {

ServeResult serve_prompt(Engine& engine, const EncodedSchema& encoded, const dsl::pml::Prompt& prompt,
                         const ServeOptions& options) {
  ServeResult out;
  out.plan = plan_prompt(encoded.layout, prompt, engine.model());
  std::vector<Parent> parents;
  for (const PromptPart& part : out.plan.parts) {
    if (part.kind == PromptPart::Kind::Cached) {
      kv::MessageId id = encoded.messages[size_t(part.piece)];
      if (id == kv::kNoMessage || !engine.store().contains(id))
        throw InputError(fmt::format("the encoding of '{}' is no longer in the cache", part.label),
                         "encode the schema again before serving prompts", prompt.where);
      parents.push_back({id, part.start_pos, int(part.tokens.size())});
      out.n_cached_tokens += int(part.tokens.size());
      continue;
    }
    PrefillRequest r;
    r.tokens = part.tokens;
    r.parents = parents;  // everything before it in the prompt
    r.new_offset = part.start_pos;
    out.prefills.push_back(engine.prefill(r));
    parents.push_back({out.prefills.back().id, part.start_pos, int(part.tokens.size())});
  }
  DecodeRequest d;
  d.header = out.plan.header;
  d.parents = std::move(parents);
  d.new_offset = out.plan.header_pos;
  d.sampling = options.sampling;
  d.max_tokens = options.max_tokens;
  d.stop = options.stop;
  d.logprobs = options.logprobs;
  d.record_logits = options.record_logits;
  d.exact_tokens = options.exact_tokens;
  out.decode = engine.decode(d);
  return out;
}

}  // namespace choreo::runtime::pml
