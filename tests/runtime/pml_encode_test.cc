// Encoding a PML layout (runtime/pml/encode.h): the waves of prefill batches, and a context overflow the
// layout makes certain. Waves used to be found by scanning every piece and its whole scaffold once per wave,
// and every piece held a copy of its scaffold, so a schema of n modules cost n^3 time and n^2 memory before
// the engine ran: 2000 modules took 28 s, 10,000 never finished (issue 42, finding 7).

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "dsl/pml/schema_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/pml/encode.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo::runtime::pml {
namespace {

/// What one prefill request asked for: its tokens, its start and where its parents sit.
struct Asked {
  std::vector<model::Token> tokens;
  int start_pos = 0;
  std::vector<int> parent_starts;
  bool operator==(const Asked&) const = default;
};

/// A request for piece `i` as the definition gives it: its tokens at its start, over its scaffold.
Asked asked_for(const Layout& layout, int i) {
  const Piece& p = layout.pieces[size_t(i)];
  Asked a{p.tokens, p.start_pos, {}};
  for (int s : scaffold_of(layout, i)) a.parent_starts.push_back(layout.pieces[size_t(s)].start_pos);
  return a;
}

/// The waves by their definition, recomputed by brute force: each wave holds, in document order, every
/// cached piece not yet encoded whose whole scaffold was encoded in earlier waves.
std::vector<std::vector<Asked>> waves_by_definition(const Layout& layout) {
  std::vector<bool> done(layout.pieces.size());
  for (size_t i = 0; i < done.size(); ++i) done[i] = !layout.pieces[i].cached;
  std::vector<std::vector<Asked>> waves;
  for (;;) {
    std::vector<int> wave;
    for (size_t i = 0; i < done.size(); ++i) {
      if (done[i]) continue;
      bool ready = true;
      for (int s : scaffold_of(layout, int(i))) ready = ready && done[size_t(s)];
      if (ready) wave.push_back(int(i));
    }
    if (wave.empty()) return waves;
    waves.emplace_back();
    for (int i : wave) {
      done[size_t(i)] = true;
      waves.back().push_back(asked_for(layout, i));
    }
  }
}

/// Sends each batch to `engine`, noting what it asked for.
struct RecordingPrefill {
  Engine& engine;
  std::vector<std::vector<Asked>> batches;
  std::vector<PrefillResult> operator()(std::vector<PrefillRequest> requests) {
    batches.emplace_back();
    for (const PrefillRequest& r : requests) {
      Asked a{r.tokens, r.new_offset.value_or(-1), {}};
      for (const auto& parent : r.parents) a.parent_starts.push_back(parent.offset.value_or(-1));
      batches.back().push_back(std::move(a));
    }
    return engine.prefill_batch(requests);
  }
};

// Nested modules, a union encoded over its scaffold member, a union without one (a gap), a module encoded per
// request and parameters: scaffolds of every shape.
constexpr const char* kSchema = R"(<schema name="shapes">
Once upon a time.
<module name="home">A small house.
  <module name="garden">A garden with <parameter name="colour" length="2"/> flowers.</module>
  <union scaffold="rain">
    <module name="sun">It was sunny.</module>
    <module name="rain">It rained <module name="hard">very hard</module> all day.</module>
  </union>
  She played.
</module>
<union>
  <module name="dog">A dog.</module>
  <module name="cat" cache="false">A cat.</module>
</union>
<module name="end">The end.</module>
</schema>)";

}  // namespace

TEST_CASE(
    "pml encode: the prefill batches are the waves the scaffolds define, each request over its scaffold") {
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  Engine engine(m, pool);
  const Layout layout = lay_out(dsl::pml::parse_schema(kSchema, "shapes.pml"), m);
  const std::vector<std::vector<Asked>> expected = waves_by_definition(layout);
  REQUIRE(expected.size() >= 4);  // not vacuous: chains, and waves of more than one piece
  RecordingPrefill record{engine, {}};
  const EncodedSchema enc = encode_layout(std::ref(record), layout, engine.models().n_ctx());
  CHECK(record.batches == expected);
  for (size_t i = 0; i < layout.pieces.size(); ++i)
    CHECK((enc.messages[i] != kv::kNoMessage) == layout.pieces[i].cached);
}

// 10,000 one-word modules, one per line, run past stories260K's context of a few hundred positions. The old
// waves reached the engine's overflow after encoding every module before it, scanning 10,000 scaffolds per
// wave; now nothing is encoded and the error names the first module past the end.
TEST_CASE("pml encode: a schema past the context is refused at its first module past it, nothing encoded") {
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  Engine engine(m, pool);
  constexpr int kModules = 10000;
  std::string text = "<schema name=\"many\">\n";
  for (int i = 0; i < kModules; ++i) text += fmt::format("<module name=\"m{}\">cat</module>\n", i);
  text += "</schema>\n";
  const Layout layout = lay_out(dsl::pml::parse_schema(text, "many.pml"), m);
  REQUIRE(layout.modules.size() == size_t(kModules));
  const int n_ctx = engine.models().n_ctx();
  REQUIRE(layout.end_pos > n_ctx);
  // The first module past the context, from the positions the layout gives.
  int first_past = -1;
  for (int i = 0; i < kModules && first_past < 0; ++i)
    if (layout.modules[size_t(i)].start_pos + layout.modules[size_t(i)].n_positions > n_ctx) first_past = i;
  REQUIRE(first_past > 0);
  RecordingPrefill record{engine, {}};
  const std::string error =
      testing::input_error_text([&] { encode_layout(std::ref(record), layout, n_ctx); });
  CHECK(record.batches.empty());
  CHECK(error.find("context overflow") != std::string::npos);
  CHECK(error.find(fmt::format("module 'm{}'", first_past)) != std::string::npos);
  CHECK(error.find(fmt::format("many.pml:{}:", first_past + 2)) != std::string::npos);
}

}  // namespace choreo::runtime::pml
