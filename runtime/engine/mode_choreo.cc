// Mode::Choreo, Prompt Choreography itself (DESIGN.md §2): a decode encodes only its header, attending to
// its parents' cached encodings at their placements, and its result is that message, header and generated
// tokens, encoded once for any later call to reuse.

#include "runtime/engine/mode.h"

namespace choreo::runtime {

namespace {

class ChoreoMode final : public CallMode {
 public:
  explicit ChoreoMode(ModeContext context) : context_(context) {}

  bool encodes_prefills() const override { return true; }

  DecodeLayout lay_out_decode(const DecodeRequest& request, size_t, int budget) override {
    const Placement placement = place(context_.store, request.parents, request.new_offset, context_.first_pos,
                                      int(request.header.size()) + budget, context_.n_ctx);
    DecodeLayout layout;
    layout.encoded =
        &new_message(context_.store, placement, request.agent, request.visibility, request.header, request.model);
    layout.views = placement.parents;
    layout.result = layout.encoded;
    for (const PlacedView& v : placement.parents) layout.n_reused += v.n_tokens;
    return layout;
  }

  void finish_decode(const DecodeRequest&, const DecodeLayout&, std::span<const model::Token>) override {}

 private:
  ModeContext context_;
};

}  // namespace

std::unique_ptr<CallMode> make_choreo_mode(ModeContext context) {
  return std::make_unique<ChoreoMode>(context);
}

}  // namespace choreo::runtime
