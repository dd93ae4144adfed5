// Encoding PML schemas and serving prompts on the engine. The property: a prompt importing every module in
// schema order (no parameters) decodes exactly like one plain KV-cache pass over the same tokens at the same
// positions; and serving reuses the modules' encodings without computing them again.

#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/session.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/serve.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo::runtime::pml {
namespace {

using Loaded = testing::LoadedModel;

Loaded& stories() { return testing::stories260k(); }

dsl::pml::Prompt prompt(const std::string& text) { return dsl::pml::parse_prompt(text, SourceLocation{"p.pml", 1, 1}); }

// Nested modules, a union whose scaffold member is its longest, text outside modules before and after.
constexpr const char* kSchema = R"(<schema name="tale">
Once upon a time, there was a little girl.
<module name="home">She lived in a small house.
  <module name="garden">The house had a garden with red flowers.</module>
  Every day she played outside.
</module>
<union scaffold="rain">
  <module name="sun">It was sunny.</module>
  <module name="rain">One day it started to rain very hard.</module>
</union>
<module name="friend">Her friend was a big brown dog.</module>
</schema>)";

TEST_CASE("pml property: modules imported in schema order decode like one pass over the same tokens (stories260K)") {
  const model::Model& m = *stories().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  Engine engine(m, pool);
  EncodedSchema enc = encode_schema(engine, dsl::pml::parse_schema(kSchema, "tale.pml"));
  const int n_schema_tokens = enc.n_computed;
  CHECK(n_schema_tokens > 0);
  ServeOptions options;
  options.sampling.temperature = 0;
  options.exact_tokens = 20;
  options.record_logits = true;
  ServeResult r = serve_prompt(engine, enc,
                               prompt("<prompt schema=\"tale\"><home><garden/></home><rain/><friend/> The girl</prompt>"),
                               options);
  // The same tokens at the same positions, contiguous from 1: the plain run's prompt.
  auto positioned = r.plan.positioned_tokens();
  std::vector<model::Token> flat = {m.vocab().bos()};
  for (size_t i = 0; i < positioned.size(); ++i) {
    REQUIRE(positioned[i].first == int(i) + 1);
    flat.push_back(positioned[i].second);
  }
  REQUIRE(r.decode.generated.size() == 20);
  kv::PagePool plain_pool(m.backend(), m.kv_layout(32), size_t(256) << 20);
  model::Session session(m, plain_pool);
  std::vector<float> logits;
  session.eval(flat, &logits);
  double worst = 0;
  for (size_t i = 0; i < r.decode.generated.size(); ++i) {
    auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    double diff = 0;
    for (size_t k = 0; k < logits.size(); ++k)
      diff = std::max(diff, double(std::fabs(logits[k] - r.decode.logits[i][k])));
    worst = std::max(worst, diff / double(*hi - *lo));
    CHECK(r.decode.generated[i] == model::argmax(logits));  // the greedy token is the plain run's
    model::Token t = r.decode.generated[i];
    session.eval(std::span<const model::Token>(&t, 1), &logits);
  }
  MESSAGE("PML vs one pass: worst max|dlogit| / range over 20 steps = ", worst);
  CHECK(worst <= 1e-5);
  // No recomputation: every module token was attended to from the cache; only the header and the generated
  // tokens went through the model.
  CHECK(r.prefills.empty());
  CHECK(r.decode.stats.n_reused == r.n_cached_tokens);
  CHECK(r.n_cached_tokens == int(positioned.size()) - int(r.plan.header.size()));
  CHECK(r.decode.stats.n_computed == int(r.plan.header.size()) + 20);
  // Encoding the schema again finds every piece by content key and computes nothing.
  EncodedSchema again = encode_schema(engine, dsl::pml::parse_schema(kSchema, "tale.pml"));
  CHECK(again.n_computed == 0);
  CHECK(again.n_deduplicated == int(again.layout.pieces.size()));
  CHECK(again.messages == enc.messages);
}

TEST_CASE("pml serve: arguments fill parameter slots at their positions, cache=false modules are encoded per "
          "request") {
  const model::Model& m = *stories().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  Engine engine(m, pool);
  EncodedSchema enc = encode_schema(engine, dsl::pml::parse_schema(R"(<schema name="s">
Once upon a time.
<module name="cat">There was a cat named <parameter name="name" length="6"/> who liked milk.</module>
<module name="mood" cache="false">The cat was happy.</module>
</schema>)",
                                                                   "s.pml"));
  const Layout& l = enc.layout;
  // Slot placeholders were encoded; the cache="false" module was not.
  CHECK(enc.messages[2] != kv::kNoMessage);
  CHECK(enc.messages[4] == kv::kNoMessage);
  ServeOptions options;
  options.sampling.temperature = 0;
  options.max_tokens = 8;
  ServeResult r = serve_prompt(engine, enc, prompt("<prompt schema=\"s\"><cat name=\"Tom\"/><mood/> Then</prompt>"), options);
  REQUIRE(r.prefills.size() == 2);  // the argument and the per-request module
  const std::vector<model::Token> tom = m.vocab().tokenize("Tom", false);
  const kv::Message& argument = engine.store().get(r.prefills[0].id);
  CHECK(argument.tokens == tom);
  CHECK(argument.start_pos == l.pieces[2].start_pos);
  CHECK(r.prefills[0].stats.n_computed == int(tom.size()));
  const kv::Message& mood = engine.store().get(r.prefills[1].id);
  CHECK(mood.start_pos == l.pieces[4].start_pos);
  CHECK(mood.tokens == l.pieces[4].tokens);
  // The mood piece attended to the argument, not the placeholders.
  bool saw_argument = false;
  for (const kv::PlacedParent& p : mood.parents) {
    CHECK(p.message != enc.messages[2]);
    saw_argument = saw_argument || p.message == r.prefills[0].id;
  }
  CHECK(saw_argument);
  // The decode attends to the cached text, the argument and the fresh module; never to the placeholders.
  const int cached = int(l.pieces[0].tokens.size() + l.pieces[1].tokens.size() + l.pieces[3].tokens.size());
  CHECK(r.n_cached_tokens == cached);
  CHECK(r.decode.stats.n_reused == cached + int(tom.size()) + int(l.pieces[4].tokens.size()));
  CHECK(r.decode.stats.start_pos == l.end_pos);
  CHECK_FALSE(r.decode.generated.empty());
}

TEST_CASE("pml serve: sampled generation is reproducible from its seed and a prompt of imports only works") {
  const model::Model& m = *stories().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
  Engine engine(m, pool);
  EncodedSchema enc = encode_schema(engine, dsl::pml::parse_schema(kSchema, "tale.pml"));
  ServeOptions options;
  options.sampling = {0.8f, 40, 0.95f, 7};
  options.exact_tokens = 12;
  auto p = prompt("<prompt schema=\"tale\"><sun/><friend/></prompt>");
  ServeResult a = serve_prompt(engine, enc, p, options);
  ServeResult b = serve_prompt(engine, enc, p, options);
  CHECK(a.decode.generated == b.decode.generated);
  CHECK(a.decode.generated.size() == 12);
  CHECK(a.plan.header.size() == 1);  // the last token of <friend/> is re-read as the header
  CHECK(a.decode.stats.n_computed == 1 + 12);
}

}  // namespace
}  // namespace choreo::runtime::pml
