#include "runtime/pml/encode.h"

#include <chrono>

namespace choreo::runtime::pml {

EncodedSchema encode_schema(Engine& engine, const dsl::pml::Schema& schema) {
  return encode_layout(engine, lay_out(schema, engine.model()));
}

EncodedSchema encode_layout(Engine& engine, Layout layout) {
  return encode_layout([&](std::vector<PrefillRequest> requests) { return engine.prefill_batch(requests); },
                       std::move(layout));
}

EncodedSchema encode_layout(const PrefillBatch& prefill, Layout layout) {
  const auto t0 = std::chrono::steady_clock::now();
  EncodedSchema out;
  out.layout = std::move(layout);
  const std::vector<Piece>& pieces = out.layout.pieces;
  out.messages.assign(pieces.size(), kv::kNoMessage);
  std::vector<bool> done(pieces.size(), false);
  for (size_t i = 0; i < pieces.size(); ++i) done[i] = !pieces[i].cached;
  // Waves: every piece whose scaffold is encoded joins the next batch. Scaffolds point backwards, so each
  // wave makes progress.
  for (;;) {
    std::vector<int> wave;
    std::vector<PrefillRequest> requests;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (done[i]) continue;
      bool ready = true;
      for (int s : pieces[i].scaffold) ready = ready && out.messages[s] != kv::kNoMessage;
      if (!ready) continue;
      PrefillRequest r;
      r.tokens = pieces[i].tokens;
      for (int s : pieces[i].scaffold) r.parents.push_back({out.messages[s], pieces[s].start_pos, std::nullopt});
      r.new_offset = pieces[i].start_pos;
      requests.push_back(std::move(r));
      wave.push_back(int(i));
    }
    if (wave.empty()) break;
    std::vector<PrefillResult> results = prefill(std::move(requests));
    for (size_t k = 0; k < wave.size(); ++k) {
      out.messages[wave[k]] = results[k].id;
      done[wave[k]] = true;
      out.n_computed += results[k].stats.n_computed;
      out.n_deduplicated += results[k].deduplicated ? 1 : 0;
    }
  }
  out.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace choreo::runtime::pml
