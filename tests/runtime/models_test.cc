// Several models in one engine (runtime/engine/model_set.h): batches that mix models, content keys per model,
// and reading another model's messages through the `recompute` plan. Every reference is the same call run on
// an engine that has only that model.

#include <cstring>

#include <doctest/doctest.h>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/gguf.h"
#include "runtime/model/lora.h"
#include "runtime/store/disk_store.h"
#include "tests/model/lora_fixtures.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using model::LoraAdapter;
using model::LoraStack;
using runtime::DecodeRequest;
using runtime::DecodeResult;
using runtime::Engine;
using runtime::ModelSet;
using runtime::Parent;
using runtime::PrefillRequest;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A sibling of `src` (a GGUF with the same architecture, shapes and vocabulary, other weights): the first
/// layer's attention norm scaled by 1.25, which changes the KV of every layer.
void write_sibling(const std::string& src, const std::string& dst) {
  const gguf::File f = gguf::File::open(src);
  gguf::Writer w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
    if (t.name == "blk.0.attn_norm.weight") {
      REQUIRE(t.type == kernels::DType::F32);
      for (size_t i = 0; i + 4 <= data.size(); i += 4) {
        float v;
        std::memcpy(&v, data.data() + i, 4);
        v *= 1.25f;
        std::memcpy(data.data() + i, &v, 4);
      }
    }
    w.add_tensor(t.name, t.shape, t.type, std::move(data));
  }
  w.write(dst);
}

/// SmolLM2 with two adapters and a sibling GGUF: the models of these tests.
struct Family {
  const model::Model& base = *testing::smollm2().model;
  testing::ScratchDir dir;
  std::unique_ptr<model::Model> sibling;
  LoraStack math, shifted;
  Family() {
    const std::string shifted_path = (dir.path / "shifted.gguf").string();
    testing::write_shifted_math_lora(shifted_path);
    const std::string sibling_path = (dir.path / "sibling.gguf").string();
    write_sibling(testing::require_file(testing::default_model()), sibling_path);
    sibling = model::Model::load(sibling_path, base.backend());
    math = LoraStack{{{LoraAdapter::load(testing::math_lora(), base), 1.0f}}};
    shifted = LoraStack{{{LoraAdapter::load(shifted_path, base), 0.75f}}};
  }
  /// base, math, shifted, sibling: indices 0..3.
  ModelSet all() const {
    ModelSet set(base);
    set.add("math", base, math);
    set.add("shifted", base, shifted);
    set.add("sibling", *sibling, {});
    return set;
  }
  /// Model i of all() alone.
  ModelSet only(int i) const {
    switch (i) {
      case 1: return ModelSet(base, math);
      case 2: return ModelSet(base, shifted);
      case 3: return ModelSet(*sibling);
      default: return ModelSet(base);
    }
  }
  kv::PagePool pool() const { return kv::PagePool(base.backend(), base.kv_layout(32), size_t(256) << 20); }
  std::vector<model::Token> tokens(const std::string& text) const { return base.vocab().tokenize(text, false, true); }
};

DecodeRequest greedy(std::vector<model::Token> header, std::vector<Parent> parents, int model, int n = 6) {
  DecodeRequest r;
  r.header = std::move(header);
  r.parents = std::move(parents);
  r.model = model;
  r.max_tokens = n;
  r.exact_tokens = n;
  r.record_logits = true;
  return r;
}

void check_same(const DecodeResult& a, const DecodeResult& b) {
  CHECK(a.generated == b.generated);
  REQUIRE(a.logits.size() == b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) CHECK(same_bits(a.logits[i], b.logits[i]));
}

TEST_CASE("models: one decode batch over the base, two adapters and a sibling GGUF equals each call on an engine of its model alone, bit for bit") {
  Family f;
  const std::vector<model::Token> passage = f.tokens("The river Thames flows through London and Oxford.");
  const std::vector<std::string> questions = {" Where does it flow?", " Name a city.", " What is it?",
                                              " Which river?"};
  kv::PagePool pool = f.pool();
  Engine engine(f.all(), pool);
  // The passage is encoded by the base model; every other model reads its own encoding of it.
  PrefillRequest pre;
  pre.tokens = passage;
  const kv::MessageId shared = engine.prefill(pre).id;
  std::vector<DecodeRequest> batch;
  for (int i = 0; i < 4; ++i) batch.push_back(greedy(f.tokens(questions[size_t(i)]), {{shared}}, i));
  const std::vector<DecodeResult> together = engine.decode_batch(batch);
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    kv::PagePool own_pool = f.pool();
    Engine alone(f.only(i), own_pool);
    const kv::MessageId own = alone.prefill(pre).id;
    const DecodeResult ref = alone.decode(greedy(f.tokens(questions[size_t(i)]), {{own}}, 0));
    check_same(together[size_t(i)], ref);
    // Model 0 read its own message; the others encoded the passage for themselves first.
    CHECK(together[size_t(i)].stats.n_cross_model == (i == 0 ? 0 : int(passage.size())));
  }
  // The models differ: no two produced the same logits.
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) CHECK(!same_bits(together[size_t(i)].logits[0], together[size_t(j)].logits[0]));
}

TEST_CASE("models: the same text under each model is its own entry, shared only by models with the same weights and adapters") {
  Family f;
  ModelSet set = f.all();
  set.add("base-again", f.base, {});       // 4: the base model under another name
  set.add("math-again", f.base, f.math);  // 5: the same adapter at the same scale
  kv::PagePool pool = f.pool();
  Engine engine(std::move(set), pool);
  std::vector<kv::MessageId> ids;
  std::vector<uint64_t> keys;
  for (int i = 0; i < 6; ++i) {
    PrefillRequest r;
    r.tokens = f.tokens("One passage, six readers.");
    r.model = i;
    const runtime::PrefillResult res = engine.prefill(r);
    ids.push_back(res.id);
    keys.push_back(engine.store().get(res.id).key);
    CHECK(res.deduplicated == (i >= 4));
  }
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) CHECK(keys[size_t(i)] != keys[size_t(j)]);
  CHECK(ids[4] == ids[0]);
  CHECK(ids[5] == ids[1]);
  // Another model's messages as parents are read through the reader's own encodings, computed once.
  DecodeRequest r = greedy(f.tokens(" Go."), {{ids[0]}}, 1, 1);
  CHECK(engine.decode(r).stats.n_cross_model == 0);  // model 1 encoded the same text at the same place: found
  r.parents = {{ids[2]}};
  CHECK(engine.decode(r).stats.n_cross_model == 0);  // also that one: same tokens, positions and parents

  // Through a persistent store: entries are read by the model that wrote them only.
  testing::ScratchDir dir;
  store::DiskStore disk((dir.path / "store").string(), true);
  PrefillRequest saved;
  saved.tokens = f.tokens("A passage written to the disk store by two models.");
  std::vector<DecodeResult> written;
  {
    kv::PagePool p = f.pool();
    Engine e(f.all(), p);
    e.set_disk_store(&disk, /*persist_prefills=*/true);
    for (int i : {0, 1}) {
      saved.model = i;
      const kv::MessageId id = e.prefill(saved).id;
      written.push_back(e.decode(greedy(f.tokens(" Summary:"), {{id}}, i)));
    }
  }
  // An engine whose model 0 is the math adapter and model 1 the base: each loads its own entry.
  ModelSet swapped(f.base, f.math);
  swapped.add("plain", f.base, {});
  kv::PagePool p = f.pool();
  Engine e(std::move(swapped), p);
  e.set_disk_store(&disk);
  for (int i : {0, 1}) {
    saved.model = i;
    const runtime::PrefillResult res = e.prefill(saved);
    CHECK(res.loaded);
    check_same(e.decode(greedy(f.tokens(" Summary:"), {{res.id}}, i)), written[size_t(1 - i)]);
  }
  // The shifted adapter has no entry: it computes its own.
  ModelSet third(f.base, f.shifted);
  kv::PagePool p3 = f.pool();
  Engine e3(std::move(third), p3);
  e3.set_disk_store(&disk);
  saved.model = 0;
  const runtime::PrefillResult res = e3.prefill(saved);
  CHECK(!res.loaded);
  CHECK(res.stats.n_computed == int(saved.tokens.size()));
}

TEST_CASE("models: a call reads another model's chain of messages at new offsets as its own model would have encoded it") {
  Family f;
  kv::PagePool pool = f.pool();
  Engine engine(f.all(), pool);
  PrefillRequest a;
  a.tokens = f.tokens("Alice: I think the answer is seven.");
  const kv::MessageId pa = engine.prefill(a).id;  // model 0
  // Model 3 (the sibling GGUF) answers over it; model 1 reads both, reordered with a gap.
  DecodeRequest reply = greedy(f.tokens(" Bob:"), {{pa}}, 3, 5);
  const DecodeResult b = engine.decode(reply);
  const int n_a = int(a.tokens.size());
  const int n_b = int(engine.store().get(b.id).tokens.size());
  DecodeRequest judge = greedy(f.tokens(" Judge:"), {{b.id, 1}, {pa, 1 + n_b + 3}}, 1, 6);
  const DecodeResult mixed = engine.decode(judge);
  CHECK(mixed.stats.n_cross_model == n_a + n_b);  // both, with b's parent under model 1
  CHECK(mixed.stats.n_reused == n_a + n_b);

  // The reference: model 1 alone encodes the same tokens at the same places.
  kv::PagePool own_pool = f.pool();
  Engine alone(f.only(1), own_pool);
  const kv::MessageId ra = alone.prefill(a).id;
  PrefillRequest rb;
  rb.tokens = engine.store().get(b.id).tokens;  // header + generated, as model 3 produced them
  rb.parents = {{ra}};
  const kv::MessageId rbid = alone.prefill(rb).id;
  check_same(mixed, alone.decode(greedy(f.tokens(" Judge:"), {{rbid, 1}, {ra, 1 + n_b + 3}}, 0, 6)));

  // Reading them again computes nothing more; releasing the originals releases the other models' copies.
  CHECK(engine.decode(judge).stats.n_cross_model == 0);
  const size_t before = engine.store().size();
  engine.release(b.id);
  CHECK(engine.store().size() == before - 2);
}

TEST_CASE("models: models that cannot share an engine, and calls naming a model it lacks, are clear errors") {
  const model::Model& smol = *testing::smollm2().model;
  const model::Model& stories = *testing::stories260k().model;
  ModelSet set(smol);
  try {
    set.add("tiny", stories, {});
    FAIL("added");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find("stories260K.gguf") != std::string::npos);
    CHECK(what.find("SmolLM2") != std::string::npos);
    CHECK(what.find("layers") != std::string::npos);
  }
  CHECK_THROWS_AS(set.add("default", smol, {}), InputError);
  CHECK_THROWS_AS(set.add("", smol, {}), InputError);
  kv::PagePool pool(smol.backend(), smol.kv_layout(32), size_t(64) << 20);
  Engine engine(std::move(set), pool);
  PrefillRequest r;
  r.tokens = smol.vocab().tokenize("Hello", false, true);
  r.model = 1;
  try {
    engine.prefill(r);
    FAIL("ran");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("model 1") != std::string::npos);
  }
  DecodeRequest d = greedy(r.tokens, {}, -1);
  CHECK_THROWS_AS(engine.decode(d), InputError);
}

TEST_CASE("models: the prefix-caching baseline never reuses another model's prefix") {
  Family f;
  kv::PagePool pool = f.pool();
  Engine engine(f.all(), pool, runtime::Mode::Prefix);
  PrefillRequest a;
  a.tokens = f.tokens("A long shared system prompt that every call starts with.");
  const kv::MessageId pa = engine.prefill(a).id;
  const DecodeResult first = engine.decode(greedy(f.tokens(" Q1"), {{pa}}, 0, 3));
  const DecodeResult other = engine.decode(greedy(f.tokens(" Q1"), {{pa}}, 2, 3));
  const DecodeResult again = engine.decode(greedy(f.tokens(" Q1"), {{pa}}, 0, 3));
  CHECK(other.stats.n_reused == 0);
  CHECK(again.stats.n_reused > 0);
  kv::PagePool own_pool = f.pool();
  Engine alone(f.only(2), own_pool, runtime::Mode::Prefix);
  const kv::MessageId own = alone.prefill(a).id;
  check_same(other, alone.decode(greedy(f.tokens(" Q1"), {{own}}, 0, 3)));
  (void)first;
}

}  // namespace
}  // namespace choreo

namespace choreo {
namespace {

using runtime::CrossModelPlan;
using Kind = runtime::CrossModelPlan::Kind;

/// A chain the base model (0) writes, read by model 1 at new offsets under `plan`; the reader's result. With
/// `disk`, the chain is loaded from it (written by an engine without plans: no E cache) instead of encoded.
struct ChainRead {
  DecodeResult result;
  int n_e_recomputed = 0;
  int n_cross_model = 0;
};
ChainRead read_chain(const Family& f, const LoraStack& reader, CrossModelPlan plan, store::DiskStore* disk = nullptr,
                     bool write = false) {
  ModelSet set(f.base);
  set.add("reader", f.base, reader);
  if (!write) set.set_plan(0, 1, plan);
  kv::PagePool pool = f.pool();
  Engine engine(set, pool);
  if (disk) engine.set_disk_store(disk, write);
  PrefillRequest p;
  p.tokens = f.tokens("Q: Which is heavier, a kilo of iron or a kilo of feathers?");
  const kv::MessageId pid = engine.prefill(p).id;
  const DecodeResult d = engine.decode(greedy(f.tokens(" A:"), {{pid}}, 0, 5));
  if (write) engine.persist(d.id);
  const int n_d = int(engine.store().get(d.id).tokens.size());
  ChainRead out;
  out.result = engine.decode(greedy(f.tokens(" Judge:"), {{d.id, 1}, {pid, 1 + n_d + 2}}, 1, 6));
  out.n_e_recomputed = out.result.stats.n_e_recomputed;
  out.n_cross_model = out.result.stats.n_cross_model;
  return out;
}

bool same_result(const DecodeResult& a, const DecodeResult& b) {
  if (a.generated != b.generated || a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (!same_bits(a.logits[i], b.logits[i])) return false;
  return true;
}

TEST_CASE(
    "models: over a chain at new offsets, partial 0..L equals recompute and an empty partial e..e equals "
    "reuse, bit for bit") {
  Family f;
  const int n_layers = f.base.config().n_layers;
  const ChainRead recompute = read_chain(f, f.math, {});
  const ChainRead reuse = read_chain(f, f.math, {Kind::Reuse});
  CHECK(!same_result(recompute.result, reuse.result));
  CHECK(reuse.n_cross_model == 0);
  CHECK(same_result(read_chain(f, f.math, CrossModelPlan::partial(0, n_layers)).result, recompute.result));
  for (int e : {0, 7, n_layers})
    CHECK(same_result(read_chain(f, f.math, CrossModelPlan::partial(e, e)).result, reuse.result));
  // A plan in between does something of its own, from the E cache saved while the chain was encoded.
  const ChainRead middle = read_chain(f, f.math, CrossModelPlan::partial(10, 15));
  CHECK(!same_result(middle.result, recompute.result));
  CHECK(!same_result(middle.result, reuse.result));
  CHECK(middle.n_e_recomputed == 0);
  CHECK(middle.n_cross_model > 0);
}

TEST_CASE("models: a partial plan gives the same bits from a saved E cache and from one the sender recomputes") {
  Family f;
  testing::ScratchDir dir;
  store::DiskStore disk((dir.path / "store").string(), true);
  read_chain(f, f.math, {}, &disk, /*write=*/true);  // the chain in the store, without E caches
  for (const CrossModelPlan& plan : {CrossModelPlan::partial(6, 21), CrossModelPlan{Kind::Partial, {{3, 5}, {9, 10}, {17, 22}}}}) {
    CAPTURE(plan.describe());
    const ChainRead saved = read_chain(f, f.math, plan);
    const ChainRead loaded = read_chain(f, f.math, plan, &disk);
    CHECK(saved.n_e_recomputed == 0);
    CHECK(loaded.n_e_recomputed > 0);
    CHECK(same_result(saved.result, loaded.result));
  }
}

TEST_CASE("models: with a sibling identical to its sender (an adapter at scale 0), every plan equals recompute") {
  Family f;
  const LoraStack zero{{{f.math.adapters.front().first, 0.0f}}};
  const int n_layers = f.base.config().n_layers;
  const ChainRead recompute = read_chain(f, zero, {});
  CHECK(recompute.n_cross_model > 0);  // another fingerprint: its own encodings are made
  for (const CrossModelPlan& plan : {CrossModelPlan{Kind::Reuse}, CrossModelPlan::partial(10, 15),
                                     CrossModelPlan::partial(0, n_layers), CrossModelPlan::partial(29, 30),
                                     CrossModelPlan{Kind::Partial, {{2, 6}, {6, 7}, {12, 20}}}}) {
    CAPTURE(plan.describe());
    CHECK(same_result(read_chain(f, zero, plan).result, recompute.result));
  }
}

TEST_CASE("models: a plan naming layers out of range is a clear error") {
  Family f;
  ModelSet set = f.all();
  for (const CrossModelPlan& bad : {CrossModelPlan::partial(3, 31), CrossModelPlan::partial(5, 2),
                                    CrossModelPlan::partial(-1, 4)}) {
    try {
      set.set_plan(0, 1, bad);
      FAIL("accepted ", bad.describe());
    } catch (const InputError& e) {
      const std::string what = e.what();
      CHECK(what.find(bad.describe()) != std::string::npos);
      CHECK(what.find("[0, 30]") != std::string::npos);
      CHECK(what.find("math reading default") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(set.set_plan(0, 7, {Kind::Reuse}), InputError);
  for (const CrossModelPlan& bad : {CrossModelPlan{Kind::Partial, {{4, 9}, {8, 12}}},
                                    CrossModelPlan{Kind::Partial, {{10, 12}, {2, 4}}}}) {
    try {
      set.set_plan(0, 1, bad);
      FAIL("accepted ", bad.describe());
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("overlap or are out of order") != std::string::npos);
    }
  }
  // Each range of every plan reading a model starts from an E cache of its own.
  set.set_plan(0, 1, CrossModelPlan::partial(4, 9));
  set.set_plan(0, 2, {Kind::Partial, {{5, 9}, {20, 21}}});
  set.save_e_caches(0, {4, 11});
  CHECK(set.e_cache_layers(0) == std::vector<int>{4, 5, 11, 20});
  CHECK(set.e_cache_layers(1).empty());
  CHECK_THROWS_AS(set.save_e_caches(0, {31}), InputError);
}

}  // namespace
}  // namespace choreo
