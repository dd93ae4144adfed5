// Repair policies on reads of cached parents (runtime/engine/repair.cc; docs/profile.md, "Repairing reused
// KV"), each pinned by a property or an independent value: `none` changes no bit, and no policy touches a
// read of an exact prefix; first:K with K at least a parent's length, and select:1, equal a full recompute of
// the parent in the call's context; first:K below that equals a float64 recomputation of the call's logits;
// the tokens select:R recomputes first are those whose layer-1 K/V deviate most, ranked here in float64; the
// repair is the call's own (the cached pages, the other readers and the content keys stay as they were);
// every policy is batch invariant; and parents brought back by the tiers, LoRA adapters and another model's
// messages are repaired the same way.

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "common/repair_policy.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/synth_lora.h"
#include "tests/runtime/bits.h"
#include "tests/runtime/page_edit.h"
#include "tests/runtime/reference_model.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using runtime::DecodeRequest;
using runtime::DecodeResult;
using runtime::Engine;
using runtime::PrefillRequest;
using testing::bit_identical;
using testing::ReferenceModel;

const model::Model& stories() { return *testing::stories260k().model; }
std::vector<model::Token> text(const std::string& s) { return stories().vocab().tokenize(s, false); }
RepairPolicy policy(const char* name) { return parse_repair_policy(name); }

const std::string kA = "Once upon a time, there was a little cat named Tom.";
const std::string kB = " Tom liked to drink milk and play with a red ball.";
const std::string kC = " The sun was warm and the grass was green and soft.";
const std::string kHeader = " One day, Tom";

kv::MessageId prefill(Engine& e, const std::string& s, std::vector<kv::MessageId> parents = {}) {
  PrefillRequest p;
  p.tokens = text(s);
  for (kv::MessageId id : parents) p.parents.push_back({id, {}, {}});
  return e.prefill(p).id;
}

/// A greedy decode of `n` tokens over `parents` (or forced to `forced`), every step's logits recorded.
DecodeRequest decode_request(const std::vector<kv::MessageId>& parents, std::optional<RepairPolicy> repair,
                             const std::vector<model::Token>& forced = {}, int n = 6,
                             const std::string& header = kHeader) {
  DecodeRequest d;
  d.header = text(header);
  for (kv::MessageId id : parents) d.parents.push_back({id, {}, {}});
  d.sampling.temperature = 0;
  d.exact_tokens = n;
  d.forced = forced;
  d.record_logits = true;
  d.repair = repair;
  return d;
}

/// The largest logit difference over the steps, relative to the range of `b`'s logits at each step.
double relative_difference(const std::vector<std::vector<float>>& a,
                           const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t s = 0; s < a.size(); ++s) {
    REQUIRE(a[s].size() == b[s].size());
    const auto [lo, hi] = std::minmax_element(b[s].begin(), b[s].end());
    double d = 0;
    for (size_t i = 0; i < a[s].size(); ++i) d = std::max(d, std::fabs(double(a[s][i]) - b[s][i]));
    worst = std::max(worst, d / double(*hi - *lo));
  }
  return worst;
}

struct Pool {
  kv::PagePool pool{stories().backend(), stories().kv_layout(16), size_t(256) << 20};
};

TEST_CASE("repair none gives the bits of no policy and no policy repairs a read of an exact prefix") {
  Pool p;
  Engine e(stories(), p.pool);
  // B encoded over [A], read at [A, B]: both in their exact prefix position.
  const kv::MessageId a = prefill(e, kA), b = prefill(e, kB, {a});
  const DecodeResult plain = e.decode(decode_request({a, b}, std::nullopt));
  for (const char* name : {"none", "first:2", "first:1000", "select:0.3", "select:1"}) {
    CAPTURE(name);
    const DecodeResult r = e.decode(decode_request({a, b}, policy(name), plain.generated));
    CHECK(bit_identical(r.logits, plain.logits));
    CHECK(r.repaired.empty());
    CHECK(r.stats.n_repaired == 0);
    CHECK(r.stats.n_computed == plain.stats.n_computed);
    CHECK(e.store().get(r.id).key == e.store().get(plain.id).key);  // the same encoding, the same key
  }
  // Read out of prefix, `none` (asked for, or set for every call) is still the plain read.
  const kv::MessageId b_alone = prefill(e, kB);
  const DecodeResult out_of_prefix = e.decode(decode_request({a, b_alone}, std::nullopt));
  CHECK(bit_identical(e.decode(decode_request({a, b_alone}, policy("none"), out_of_prefix.generated)).logits,
                      out_of_prefix.logits));
  e.set_repair(policy("none"));
  const DecodeResult overridden =
      e.decode(decode_request({a, b_alone}, policy("first:1000"), out_of_prefix.generated));
  CHECK(bit_identical(overridden.logits, out_of_prefix.logits));
  CHECK(overridden.repaired.empty());
}

TEST_CASE(
    "repair first:K with K at least the parent's length and select:1 equal a full recompute in the call's "
    "context") {
  Pool p;
  Engine e(stories(), p.pool);
  const kv::MessageId a = prefill(e, kA), b_alone = prefill(e, kB), b_in_context = prefill(e, kB, {a});
  const int n_b = int(text(kB).size()), n_layers = stories().config().n_layers;
  // The full recompute: B encoded over [A] (the master equivalence's chain).
  const DecodeResult full = e.decode(decode_request({a, b_in_context}, std::nullopt));
  const std::vector<float> cached_pages = testing::page_floats(e.store().get(b_alone).pages);
  const DecodeResult none = e.decode(decode_request({a, b_alone}, std::nullopt, full.generated));
  const double none_difference = relative_difference(none.logits, full.logits);
  CHECK(none_difference > 1e-3);  // not vacuous: B read out of prefix differs
  for (const std::string& name :
       {fmt::format("first:{}", n_b), std::string("first:1000"), std::string("select:1")}) {
    CAPTURE(name);
    const DecodeResult r = e.decode(decode_request({a, b_alone}, policy(name.c_str()), full.generated));
    const double difference = relative_difference(r.logits, full.logits);
    MESSAGE(name, ": max |Δlogit| / range against the full recompute ", difference,
            " (none: ", none_difference, ")");
    CHECK(difference <= 1e-5);
    REQUIRE(r.repaired.size() == 1);  // A is read in its exact prefix position
    CHECK(r.repaired[0].message == b_alone);
    CHECK(r.repaired[0].layers == std::vector<int>(size_t(n_b), n_layers));
    CHECK(r.stats.n_repaired == n_b);
    CHECK(r.stats.n_computed == none.stats.n_computed + n_b);
    CHECK(r.stats.n_reused == none.stats.n_reused - n_b);
    CHECK(e.store().get(r.id).key != e.store().get(none.id).key);  // another encoding, another key
  }
  // The repair was each call's own: B's pages are as they were, and a plain read of them gives the same bits.
  CHECK(testing::page_floats(e.store().get(b_alone).pages) == cached_pages);
  CHECK(bit_identical(e.decode(decode_request({a, b_alone}, std::nullopt, full.generated)).logits,
                      none.logits));
  // set_repair gives a policy to calls that ask for none.
  e.set_repair(policy("first:1000"));
  CHECK(relative_difference(e.decode(decode_request({a, b_alone}, policy("none"), full.generated)).logits,
                            full.logits) <= 1e-5);
}

TEST_CASE("repair on the CUDA kernels - block emulator: first:1000 and select:1 equal a full recompute") {
  // The same property where every norm, RoPE, KV store, page copy and segment attention (with the negative
  // deltas of a repair pass) is a CUDA kernel run by the emulator.
  const model::Model& m = *testing::stories260k_cuda_emulated().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  Engine e(m, pool);
  const kv::MessageId a = prefill(e, kA), b_alone = prefill(e, kB), b_in_context = prefill(e, kB, {a});
  const DecodeResult full = e.decode(decode_request({a, b_in_context}, std::nullopt, {}, 2));
  CHECK(relative_difference(e.decode(decode_request({a, b_alone}, std::nullopt, full.generated)).logits,
                            full.logits) > 1e-3);
  for (const char* name : {"first:1000", "select:1"}) {
    CAPTURE(name);
    CHECK(relative_difference(e.decode(decode_request({a, b_alone}, policy(name), full.generated)).logits,
                              full.logits) <= 1e-5);
  }
}

/// float64 encodings of BOS, A, and B alone (cached), on stories260K.
struct Reference {
  ReferenceModel model{stories()};
  std::vector<int32_t> bos{stories().vocab().bos()};
  std::vector<int32_t> a = text(kA), b = text(kB), c = text(kC), header = text(kHeader);
  ReferenceModel::Encoding e_bos = model.encode(bos, 0, {});
  ReferenceModel::Encoding e_a = model.encode(a, 1, {{&e_bos, 0, 1}});
  ReferenceModel::Encoding e_b = model.encode(b, 1, {{&e_bos, 0, 1}});
  ReferenceModel::Encoding e_c = model.encode(c, 1, {{&e_bos, 0, 1}});
  int shift_b = int(a.size());             // B encoded at 1, read at 1 + |A|
  int shift_c = int(a.size() + b.size());  // C encoded at 1, read at 1 + |A| + |B|
};

TEST_CASE(
    "repair first:K below the parent's length equals a float64 recomputation of its first K tokens in "
    "context") {
  REQUIRE(stories().vocab().add_bos());
  Reference ref;
  const int k = 5;
  REQUIRE(int(ref.b.size()) > 2 * k);
  // B spans two pages of 16 tokens: the call copies the first (its first k tokens) and reads B's own second.
  REQUIRE(ref.b.size() > 16);
  // B's first k tokens recomputed in B's own frame, everything before it shifted back by B's delta; the rest
  // of B as cached.
  const ReferenceModel::Encoding fresh =
      ref.model.encode(std::span<const int32_t>(ref.b).first(size_t(k)), 1,
                       {{&ref.e_bos, -ref.shift_b, 1}, {&ref.e_a, -ref.shift_b, int(ref.a.size())}});
  ReferenceModel::Encoding mixed = ref.e_b;
  for (size_t l = 0; l < mixed.k.size(); ++l)
    for (int t = 0; t < k; ++t) {
      mixed.k[l][size_t(t)] = fresh.k[l][size_t(t)];
      mixed.v[l][size_t(t)] = fresh.v[l][size_t(t)];
    }
  std::vector<double> expected;
  ref.model.encode(
      ref.header, 1 + ref.shift_c,
      {{&ref.e_bos, 0, 1}, {&ref.e_a, 0, int(ref.a.size())}, {&mixed, ref.shift_b, int(ref.b.size())}},
      &expected);
  Pool p;
  Engine e(stories(), p.pool);
  const kv::MessageId a = prefill(e, kA), b = prefill(e, kB);
  const DecodeResult r = e.decode(decode_request({a, b}, policy(fmt::format("first:{}", k).c_str()), {}, 1));
  const DecodeResult none = e.decode(decode_request({a, b}, std::nullopt, {}, 1));
  const auto difference = [&](const std::vector<float>& logits) {
    double d = 0, lo = expected[0], hi = expected[0];
    for (size_t i = 0; i < expected.size(); ++i) {
      d = std::max(d, std::fabs(logits[i] - expected[i]));
      lo = std::min(lo, expected[i]);
      hi = std::max(hi, expected[i]);
    }
    return d / (hi - lo);
  };
  MESSAGE("first:", k, " against float64: ", difference(r.logits[0]),
          "; none against it: ", difference(none.logits[0]));
  CHECK(difference(r.logits[0]) <= 1e-4);
  CHECK(difference(none.logits[0]) > 1e-3);  // the reference tells the two apart
  REQUIRE(r.repaired.size() == 1);
  for (size_t t = 0; t < r.repaired[0].layers.size(); ++t)
    CHECK(r.repaired[0].layers[t] == (int(t) < k ? stories().config().n_layers : 0));
}

TEST_CASE(
    "repair select:R recomputes first the tokens whose layer-1 KV deviate most - float64 ranking on "
    "stories260K") {
  REQUIRE(stories().vocab().add_bos());
  Reference ref;
  const int n_layers = stories().config().n_layers;
  REQUIRE(n_layers >= 5);  // layers 0-1 whole, then narrowed at 2, 3 and 4
  // Layers 0 and 1 of every token of B and C recomputed in the call's context: their layer-1 K/V are a full
  // recompute's (C's read B's full recompute at layers 0 and 1, in C's own frame).
  const ReferenceModel::Encoding b_full = ref.model.encode(
      ref.b, 1, {{&ref.e_bos, -ref.shift_b, 1}, {&ref.e_a, -ref.shift_b, int(ref.a.size())}});
  const ReferenceModel::Encoding c_full =
      ref.model.encode(ref.c, 1,
                       {{&ref.e_bos, -ref.shift_c, 1},
                        {&ref.e_a, -ref.shift_c, int(ref.a.size())},
                        {&b_full, ref.shift_b - ref.shift_c, int(ref.b.size())}});
  std::vector<double> deviation;  // B's tokens, then C's
  for (auto [full, cached] : {std::pair{&b_full, &ref.e_b}, std::pair{&c_full, &ref.e_c}})
    for (size_t t = 0; t < full->k[1].size(); ++t) {
      double d = 0;
      for (size_t j = 0; j < full->k[1][t].size(); ++j) {
        d += std::pow(full->k[1][t][j] - cached->k[1][t][j], 2);
        d += std::pow(full->v[1][t][j] - cached->v[1][t][j], 2);
      }
      deviation.push_back(d);
    }
  const double r = 0.3;
  const size_t n = deviation.size();
  const auto count = [&](double f) { return size_t(std::ceil(f * double(n) * (1 - 1e-6))); };
  const size_t kept = count(1.5 * r);
  std::vector<double> sorted = deviation;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const double threshold = sorted[kept - 1];
  MESSAGE("layer-1 deviations: largest ", sorted.front(), ", the last kept ", threshold, ", the first left ",
          sorted[kept], ", smallest ", sorted.back());
  REQUIRE(threshold > sorted[kept] * (1 + 1e-3));  // no near-tie at the cut: the ranking decides it

  Pool p;
  Engine e(stories(), p.pool);
  const kv::MessageId a = prefill(e, kA), b = prefill(e, kB), c = prefill(e, kC);
  const DecodeResult result = e.decode(decode_request({a, b, c}, policy("select:0.3"), {}, 1));
  REQUIRE(result.repaired.size() == 2);
  CHECK(result.repaired[0].message == b);
  CHECK(result.repaired[1].message == c);
  std::vector<int> layers = result.repaired[0].layers;
  layers.insert(layers.end(), result.repaired[1].layers.begin(), result.repaired[1].layers.end());
  REQUIRE(layers.size() == n);
  size_t at_3 = 0, at_4 = 0, at_all = 0;
  for (size_t t = 0; t < n; ++t) {
    CAPTURE(t);
    CHECK(layers[t] >= 2);  // every token at layers 0 and 1
    CHECK((layers[t] >= 3) == (deviation[t] >= threshold));
    at_3 += layers[t] >= 3;
    at_4 += layers[t] >= 4;
    at_all += layers[t] == n_layers;
  }
  // Narrowed layer by layer: 1.5 R, 1.25 R, then R of the tokens (each set inside the one before, as a count
  // of layers says).
  CHECK(at_3 == kept);
  CHECK(at_4 == count(1.25 * r));
  CHECK(at_all == count(r));
}

TEST_CASE("repair: every policy is batch invariant - a call's logits are the same bits alone or batched") {
  Pool p;
  Engine e(stories(), p.pool);
  const kv::MessageId a = prefill(e, kA), b = prefill(e, kB), c = prefill(e, kC);
  const std::vector<std::vector<kv::MessageId>> parents = {{a, b}, {b, a, c}, {a, b, c}, {c}};
  for (const char* name : {"none", "first:3", "select:0.3"}) {
    CAPTURE(name);
    std::vector<DecodeRequest> batch;
    std::vector<DecodeResult> alone;
    for (size_t i = 0; i < parents.size(); ++i) {
      batch.push_back(decode_request(parents[i], policy(name), {}, 4 + int(i)));
      alone.push_back(e.decode(batch.back()));
    }
    const std::vector<DecodeResult> together = e.decode_batch(batch);
    for (size_t i = 0; i < parents.size(); ++i) {
      CAPTURE(i);
      CHECK(bit_identical(together[i].logits, alone[i].logits));
      CHECK(together[i].stats.n_repaired == alone[i].stats.n_repaired);
    }
    if (std::string(name) != "none") CHECK(alone[1].stats.n_repaired > 0);
  }
}

TEST_CASE(
    "repair first:K rides in the call's own first pass: the same bits as in passes of its own (an engine whose "
    "batch cannot hold them)") {
  // With max_batch 4 the recomputed rows (8 of each parent read out of place) do not fit beside the call's
  // rows, so they run in passes of their own (the path every other policy takes); with 512 they ride in the
  // call's first pass. A prefill over repaired parents, read by a later decode, and a batch of decodes.
  const auto run = [&](int max_batch, std::vector<int>& n_repaired) {
    Pool p;
    Engine e(stories(), p.pool, runtime::Mode::Choreo, max_batch);
    const kv::MessageId a = prefill(e, kA), b = prefill(e, kB), c = prefill(e, kC);
    PrefillRequest q;
    q.tokens = text(" They ran to the park.");
    q.parents = {{c, {}, {}}, {b, {}, {}}};
    q.repair = policy("first:8");
    const runtime::PrefillResult pre = e.prefill(q);
    n_repaired.push_back(pre.stats.n_repaired);
    std::vector<DecodeRequest> batch = {decode_request({a, b}, policy("first:8")),
                                        decode_request({b, a, c}, policy("first:8"), {}, 5),
                                        decode_request({pre.id}, std::nullopt, {}, 4, " So")};
    std::vector<std::vector<float>> logits;
    for (const DecodeResult& r : e.decode_batch(batch)) {
      logits.insert(logits.end(), r.logits.begin(), r.logits.end());
      n_repaired.push_back(r.stats.n_repaired);
    }
    return logits;
  };
  std::vector<int> repaired_fused, repaired_own;
  const auto fused = run(512, repaired_fused);
  const auto own = run(4, repaired_own);
  CHECK(bit_identical(fused, own));
  CHECK(repaired_fused == repaired_own);
  CHECK(repaired_fused == std::vector<int>{8, 8, 16, 0});
}

TEST_CASE(
    "repair with tiers: parents brought back from T1 and a repaired message recomputed give the same bits") {
  const size_t page_bytes = stories().kv_layout(16).page_bytes();
  const auto run = [&](size_t t0_pages, size_t t1_bytes, int& n_loaded, int& n_recomputed) {
    kv::PagePool pool(stories().backend(), stories().kv_layout(16), t0_pages * page_bytes);
    Engine e(stories(), pool);
    e.set_tiers({t1_bytes, kv::EvictionPolicy::Lru, 0});
    const kv::MessageId a = prefill(e, kA), b = prefill(e, kB);
    const std::vector<std::string> others = {"Lily saw a big dog.",   "The bird sang a song.",
                                             "Sam ate a red apple.",  "It rained all day long.",
                                             "Mom made a warm soup.", "The cat slept."};
    for (const std::string& s : others) prefill(e, s);  // A and B leave T0
    const DecodeResult first = e.decode(decode_request({a, b}, policy("first:3")));
    for (const std::string& s : others) prefill(e, s + " Again.");  // and so does the repaired decode
    // The repaired decode read by another call: from T1, or recomputed (with its repair) where there is no
    // T1.
    const DecodeResult second = e.decode(decode_request({first.id}, std::nullopt, {}, 4, " So"));
    n_loaded = first.stats.n_loaded + second.stats.n_loaded;
    n_recomputed = first.stats.n_recomputed + second.stats.n_recomputed;
    std::vector<std::vector<float>> logits = first.logits;
    logits.insert(logits.end(), second.logits.begin(), second.logits.end());
    return logits;
  };
  int loaded = 0, recomputed = 0;
  const auto resident = run(1024, 0, loaded, recomputed);
  CHECK(loaded + recomputed == 0);
  const auto from_t1 = run(7, size_t(64) << 20, loaded, recomputed);
  CHECK(loaded > 0);
  CHECK(bit_identical(from_t1, resident));
  const auto again = run(7, 0, loaded, recomputed);
  CHECK(recomputed > 0);
  CHECK(bit_identical(again, resident));
}

TEST_CASE("repair with a LoRA adapter and across models: first:1000 equals the reader's own full recompute") {
  testing::ScratchDir dir;
  const std::string path = (dir.path / "adapter.gguf").string();
  model::SynthLoraSpec spec;
  spec.strength = 0.2f;
  model::write_synthetic_lora(stories(), spec, path);
  const model::LoraStack adapter{{{model::LoraAdapter::load(path, stories()), 1.0f}}};
  runtime::ModelSet set(stories());
  set.add("sibling", stories(), adapter);
  set.set_plan(0, 1, {runtime::CrossModelPlan::Kind::Reuse, {}});
  Pool p;
  Engine e(set, p.pool);
  // The sibling's own chain (its full recompute), and the base model's messages it reads as they are.
  const auto on = [&](int model, const std::string& s, std::vector<kv::MessageId> parents) {
    PrefillRequest r;
    r.tokens = text(s);
    r.model = model;
    for (kv::MessageId id : parents) r.parents.push_back({id, {}, {}});
    return e.prefill(r).id;
  };
  const kv::MessageId a1 = on(1, kA, {}), b1 = on(1, kB, {a1});
  DecodeRequest d = decode_request({a1, b1}, std::nullopt);
  d.model = 1;
  const DecodeResult full = e.decode(d);
  const kv::MessageId a0 = on(0, kA, {}), b0 = on(0, kB, {});
  const kv::MessageId b1_alone = on(1, kB, {});
  for (auto [parents, name] :
       {std::pair{std::vector{a1, b1_alone}, "the adapter's own messages"},
        std::pair{std::vector{a0, b0}, "the base model's messages, read as they are"}}) {
    CAPTURE(name);
    DecodeRequest none = decode_request(parents, std::nullopt, full.generated);
    none.model = 1;
    DecodeRequest repaired = none;
    repaired.repair = policy("first:1000");
    const double before = relative_difference(e.decode(none).logits, full.logits);
    const DecodeResult r = e.decode(repaired);
    MESSAGE(std::string(name), ": none ", before, ", first:1000 ", relative_difference(r.logits, full.logits));
    CHECK(before > 1e-3);
    CHECK(relative_difference(r.logits, full.logits) <= 1e-5);
  }
}

}  // namespace
}  // namespace choreo
