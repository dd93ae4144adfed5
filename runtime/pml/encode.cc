#include "runtime/pml/encode.h"

#include <fmt/format.h>

#include <chrono>

#include "common/error.h"

namespace choreo::runtime::pml {

EncodedSchema encode_schema(Engine& engine, const dsl::pml::Schema& schema) {
  return encode_layout(engine, lay_out(schema, engine.model()));
}

EncodedSchema encode_layout(Engine& engine, Layout layout) {
  return encode_layout([&](std::vector<PrefillRequest> requests) { return engine.prefill_batch(requests); },
                       std::move(layout), engine.models().n_ctx());
}

void check_layout_fits(const Layout& layout, int n_ctx) {
  for (const Piece& p : layout.pieces) {
    if (!p.cached || p.start_pos + p.n_positions <= n_ctx) continue;
    const std::string what = p.module >= 0 ? fmt::format("module '{}'", layout.modules[size_t(p.module)].path)
                                           : "the schema's text";
    throw InputError(fmt::format("context overflow: {} of schema '{}' takes positions {}..{}, beyond the "
                                 "model's context of {} (the schema ends at {})",
                                 what, layout.schema_name, p.start_pos, p.start_pos + p.n_positions - 1,
                                 n_ctx, layout.end_pos),
                     "shorten the schema, or split it into schemas that each fit the context", p.where);
  }
}

EncodedSchema encode_layout(const PrefillBatch& prefill, Layout layout, int n_ctx) {
  check_layout_fits(layout, n_ctx);
  const auto t0 = std::chrono::steady_clock::now();
  EncodedSchema out;
  out.layout = std::move(layout);
  const std::vector<Piece>& pieces = out.layout.pieces;
  out.messages.assign(pieces.size(), kv::kNoMessage);
  // Waves: a piece is ready once its whole scaffold is encoded, which is once its scaffold_last is (each
  // piece of the chain comes after the one before it). Scaffolds point backwards, so one pass finds every
  // wave.
  std::vector<std::vector<int>> waves;
  std::vector<int> wave_of(pieces.size(), -1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i].cached) continue;
    const int last = pieces[i].scaffold_last;
    wave_of[i] = last < 0 ? 0 : wave_of[size_t(last)] + 1;
    if (size_t(wave_of[i]) == waves.size()) waves.emplace_back();
    waves[size_t(wave_of[i])].push_back(int(i));
  }
  for (const std::vector<int>& wave : waves) {
    std::vector<PrefillRequest> requests;
    requests.reserve(wave.size());
    for (int i : wave) {
      PrefillRequest r;
      r.tokens = pieces[size_t(i)].tokens;
      for (int s : scaffold_of(out.layout, i))
        r.parents.push_back({out.messages[size_t(s)], pieces[size_t(s)].start_pos, std::nullopt});
      r.new_offset = pieces[size_t(i)].start_pos;
      requests.push_back(std::move(r));
    }
    std::vector<PrefillResult> results = prefill(std::move(requests));
    for (size_t k = 0; k < wave.size(); ++k) {
      out.messages[size_t(wave[k])] = results[k].id;
      out.n_computed += results[k].stats.n_computed;
      out.n_deduplicated += results[k].deduplicated ? 1 : 0;
    }
  }
  out.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace choreo::runtime::pml
