#include "runtime/engine/mode_naive.h"

#include <climits>

#include "common/error.h"

namespace choreo::runtime {

DecodeLayout NaiveMode::lay_out_decode(const DecodeRequest& request, size_t index, int budget) {
  kv::MessageStore& store = context_.store;
  const int first_pos = context_.first_pos;
  // The parents' offsets are ignored: a chat prompt is their text in list order. Placing them still checks
  // that they exist.
  const Placement text_only = place(store, request.parents, std::nullopt, first_pos, 0, INT32_MAX / 2, false);
  std::vector<model::Token> flat;
  for (const PlacedView& v : text_only.parents) {
    const kv::Message& p = store.get(v.message);
    flat.insert(flat.end(), p.tokens.begin(), p.tokens.begin() + v.n_tokens);
  }
  flat.insert(flat.end(), request.header.begin(), request.header.end());
  if (first_pos + int(flat.size()) + budget > context_.n_ctx)
    throw InputError(fmt::format("context overflow: decode #{} needs {} positions, the model has {}", index,
                                 first_pos + int(flat.size()) + budget, context_.n_ctx));
  const ReusedPrefix prefix = reusable_prefix(request, flat);
  const Placement placement = place(store, prefix.chunks, first_pos + prefix.n_tokens, first_pos,
                                    int(flat.size()) - prefix.n_tokens + budget, context_.n_ctx);
  DecodeLayout layout;
  layout.encoded = &new_message(store, placement, request.agent, request.visibility,
                                std::vector<model::Token>(flat.begin() + prefix.n_tokens, flat.end()), request.model);
  layout.views = placement.parents;
  layout.result =
      &new_message(store, Placement{{}, first_pos}, request.agent, request.visibility, request.header, request.model);
  layout.n_reused = prefix.n_tokens;
  return layout;
}

void NaiveMode::finish_decode(const DecodeRequest&, const DecodeLayout& layout,
                              std::span<const model::Token> generated) {
  layout.result->tokens.insert(layout.result->tokens.end(), generated.begin(), generated.end());
}

std::unique_ptr<CallMode> make_naive_mode(ModeContext context) {
  return std::make_unique<NaiveMode>(context);
}

}  // namespace choreo::runtime
