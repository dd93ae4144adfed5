// KV tiers (runtime/kv/tiers.h, issue 11): a page pool with a budget smaller than the run's working set
// evicts messages no running call uses, to T1 (host memory) when it has room, else nowhere; a message read
// again is loaded back or recomputed over its parents. Each property below can fail:
// - the same calls give bit-identical tokens, logits and pages whatever the budgets and policy;
// - the budgets hold (peak bytes by the allocators' own accounting);
// - the eviction order is the KVFlow order worked out by hand;
// - a working set that cannot fit is a clear InputError naming the budget, never a crash.

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/run_report.h"
#include "runtime/kv/page_pool.h"
#include "runtime/kv/tiers.h"
#include "runtime/store/disk_store.h"
#include "tests/scratch_dir.h"
#include "tests/runtime/bits.h"
#include "tests/runtime/page_edit.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using runtime::DecodeRequest;
using runtime::Engine;
using runtime::Parent;
using runtime::PrefillRequest;

std::vector<model::Token> text(const model::Model& m, const std::string& s) { return m.vocab().tokenize(s, false); }

/// What a scenario produced: every decode's tokens and logits, and every message's pages as bytes.
struct Outcome {
  std::vector<std::vector<model::Token>> generated;
  std::vector<std::vector<std::vector<float>>> logits;
  std::vector<std::vector<float>> pages;  // per message, its pages' floats up to its last token's page
  kv::TierStats stats;
  size_t t0_budget = 0, t0_peak = 0, t1_budget = 0, t1_peak = 0;
};

/// A run of prefills and decodes with reordered, overlapping and offset parents, a release, and messages
/// read again rounds after they were written, so that a small T0 has to evict and bring back.
Outcome scenario(size_t t0_bytes, const kv::TierSettings& tiers, const std::string& disk_dir = {},
                 const model::Model& m = *testing::stories260k().model) {
  kv::PagePool pool(m.backend(), m.kv_layout(16), t0_bytes);
  std::unique_ptr<store::DiskStore> disk;
  Engine e(m, pool);
  if (!disk_dir.empty()) {
    disk = std::make_unique<store::DiskStore>(disk_dir);
    e.set_disk_store(disk.get());
  }
  e.set_tiers(tiers);
  Outcome out;
  auto decode = [&](std::vector<Parent> parents, const std::string& header, int n) {
    DecodeRequest r;
    r.header = text(m, header);
    r.parents = std::move(parents);
    r.max_tokens = n;
    r.record_logits = true;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 7 + out.generated.size();
    runtime::DecodeResult d = e.decode(r);
    out.generated.push_back(d.generated);
    out.logits.push_back(d.logits);
    return d.id;
  };
  const kv::MessageId a = e.prefill({text(m, "Once upon a time there was a little girl named Lily who loved the sea."), {}}).id;
  const kv::MessageId b = e.prefill({text(m, "She had a red ball and a big dog called Max."), {{a}}}).id;
  const kv::MessageId c = e.prefill({text(m, "One day the sun was hot and the sky was blue."), {{b}, {a, 40}}}).id;
  const kv::MessageId d1 = decode({{a}, {c}}, " Then", 24);
  const kv::MessageId d2 = decode({{c, 3}, {b, 3}}, " The dog", 20);  // two parents at one offset
  // A batch of three decodes over shared parents.
  std::vector<DecodeRequest> batch(3);
  for (int i = 0; i < 3; ++i) {
    batch[i].header = text(m, i == 0 ? " Lily" : i == 1 ? " Max" : " The sea");
    batch[i].parents = {{d1}, {i == 2 ? a : b}};
    batch[i].max_tokens = 16 + 4 * i;
    batch[i].record_logits = true;
    batch[i].sampling.seed = 100 + i;
  }
  std::vector<kv::MessageId> round2;
  for (runtime::DecodeResult& r : e.decode_batch(batch)) {
    out.generated.push_back(r.generated);
    out.logits.push_back(r.logits);
    round2.push_back(r.id);
  }
  e.release(b);  // its children can still be recomputed: the record stays as a recipe
  const kv::MessageId d3 = decode({{round2[0]}, {round2[1]}, {d2}}, " In the end", 24);
  decode({{a}, {d3}, {round2[2]}}, " So", 16);
  decode({{a}, {c}}, " Then", 24);  // d1's call again: its parents come back from wherever they are
  for (kv::MessageId id = 0; id < e.store().n_records(); ++id) {
    if (!e.store().contains(id)) continue;
    const kv::Message& msg = e.store().get(id);
    if (!msg.complete()) continue;
    e.prefetch(id);
    const kv::Message& now = e.store().get(id);
    const size_t n_pages = (now.tokens.size() + 15) / 16;
    out.pages.push_back(testing::page_floats(now.pages, n_pages));
  }
  out.stats = e.tier_stats();
  out.t0_budget = pool.budget_bytes();
  out.t0_peak = pool.peak_bytes();
  out.t1_budget = tiers.host_bytes;
  out.t1_peak = out.stats.t1_peak_bytes;
  return out;
}

void check_same(const Outcome& ref, const Outcome& got) {
  REQUIRE(ref.generated.size() == got.generated.size());
  for (size_t i = 0; i < ref.generated.size(); ++i) {
    CAPTURE(i);
    CHECK(ref.generated[i] == got.generated[i]);
    REQUIRE(ref.logits[i].size() == got.logits[i].size());
    for (size_t s = 0; s < ref.logits[i].size(); ++s) CHECK(testing::bit_identical(ref.logits[i][s], got.logits[i][s]));
  }
  REQUIRE(ref.pages.size() == got.pages.size());
  for (size_t i = 0; i < ref.pages.size(); ++i) {
    CAPTURE(i);
    CHECK(testing::bit_identical(ref.pages[i], got.pages[i]));
  }
}

TEST_CASE("tiers: tokens, logits and pages are bit-identical whatever the budgets and the policy") {
  const Outcome ref = scenario(size_t(64) << 20, {});
  CHECK(ref.stats.t0_evictions == 0);
  const size_t page = testing::stories260k().model->kv_layout(16).page_bytes();
  const size_t peak_pages = ref.t0_peak / page;
  MESSAGE("the scenario holds " << peak_pages << " pages at its peak");
  REQUIRE(peak_pages >= 16);
  for (kv::EvictionPolicy policy : {kv::EvictionPolicy::Lru, kv::EvictionPolicy::Workflow}) {
    for (size_t t0_pages : {peak_pages * 2 / 3, peak_pages * 5 / 6}) {
      for (size_t t1_pages : {size_t(0), peak_pages / 4, size_t(1000)}) {
        CAPTURE(kv::policy_name(policy));
        CAPTURE(t0_pages);
        CAPTURE(t1_pages);
        const Outcome got = scenario(t0_pages * page, {t1_pages * page, policy});
        check_same(ref, got);
        CHECK(got.stats.t0_evictions > 0);
        // The budgets hold, by the allocators' accounting.
        CHECK(got.t0_peak <= got.t0_budget);
        CHECK(got.t1_peak <= got.t1_budget);
        if (t1_pages == 0) {
          CHECK(got.stats.recomputes > 0);  // nothing below T0: evicted messages were recomputed
          CHECK(got.stats.t1_hits == 0);
        }
        if (t1_pages == 1000) {
          CHECK(got.stats.t1_hits > 0);  // everything fits in T1: evicted messages came back from it
          CHECK(got.stats.recomputes == 0);
        }
      }
    }
  }
}

TEST_CASE("tiers: T2 (the persistent store) takes what T1 has no room for, and gives back the same bits") {
  const Outcome ref = scenario(size_t(64) << 20, {});
  const size_t page = testing::stories260k().model->kv_layout(16).page_bytes();
  const size_t peak_pages = ref.t0_peak / page;
  for (size_t t1_pages : {size_t(0), peak_pages / 4}) {
    CAPTURE(t1_pages);
    testing::ScratchDir dir;
    const Outcome got = scenario(peak_pages * 2 / 3 * page, {t1_pages * page, kv::EvictionPolicy::Workflow,
                                                             size_t(64) << 20}, dir.str());
    check_same(ref, got);
    CHECK(got.stats.t2.writes > 0);
    CHECK(got.stats.t2.hits > 0);
    CHECK(got.stats.t2.bad == 0);
    // Released records (a recipe only) are the only messages recomputed: everything else came back.
    CHECK(got.stats.recomputes <= 1);
  }
}

/// Bytes of the pages a scenario read back itself at its end (through PageList::to_host: pageable memory).
uint64_t pages_read_bytes(const Outcome& o) {
  uint64_t bytes = 0;
  for (const std::vector<float>& p : o.pages) bytes += p.size() * sizeof(float);
  return bytes;
}

TEST_CASE("tiers: on the emulated CUDA backend every tier copy is from or to pinned memory, and the bits are unchanged") {
  // The emulated device counts each device copy by whether its host side is alloc_host memory (pinned on a
  // GPU). T1's copies (evictions to T1, loads back) are from its pinned pages; T2's (entries written and read:
  // buffers and mapped files) and the scenario's own page reads at its end are pageable memory, staged through
  // the pinned pool. So no copy of the run is pageable.
  const model::Model& m = *testing::stories260k_cuda_emulated().model;
  const Outcome ref = scenario(size_t(64) << 20, {}, {}, m);
  CHECK(ref.stats.t0_evictions == 0);
  const size_t page = m.kv_layout(16).page_bytes();
  const size_t peak_pages = ref.t0_peak / page;
  REQUIRE(peak_pages >= 16);
  for (bool with_t2 : {false, true}) {
    CAPTURE(with_t2);
    testing::ScratchDir dir;
    const kernels::HostCopyCounts before = kernels::emulated_host_copies(m.backend());
    const size_t t1_pages = with_t2 ? peak_pages / 4 : 1000;
    const Outcome got = scenario(peak_pages * 2 / 3 * page,
                                 {t1_pages * page, kv::EvictionPolicy::Workflow, with_t2 ? size_t(64) << 20 : 0},
                                 with_t2 ? dir.str() : std::string(), m);
    const kernels::HostCopyCounts after = kernels::emulated_host_copies(m.backend());
    check_same(ref, got);
    CHECK(got.stats.t1_offloads > 0);
    CHECK(got.stats.t1_hits > 0);
    CHECK(after.pageable == before.pageable);
    const uint64_t t1_bytes = got.stats.t1_offload_bytes + got.stats.t1_load_bytes;
    uint64_t least = t1_bytes + pages_read_bytes(got);
    if (with_t2) {
      CHECK(got.stats.t2.writes > 0);
      CHECK(got.stats.t2.hits > 0);
      least += got.stats.t2.load_bytes;
    }
    CHECK(after.pinned_bytes - before.pinned_bytes >= least);
  }
}

/// A message and a decode over it, with the decode's logits when nothing is ever evicted.
struct OneParent {
  PrefillRequest first;
  DecodeRequest request;  // its parents are set by the caller
  std::vector<std::vector<float>> want;
};

OneParent one_parent(const model::Model& m) {
  OneParent c;
  c.first = {text(m, "Once upon a time there was a little girl named Lily who loved the sea and the sun."), {}};
  c.request.header = text(m, " She");
  c.request.max_tokens = 8;
  c.request.record_logits = true;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  Engine e(m, pool);
  DecodeRequest r = c.request;
  r.parents = {{e.prefill(c.first).id}};
  c.want = e.decode(r).logits;
  return c;
}

/// Flips one byte of the last page's data of a store entry.
void flip_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-16, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(-16, std::ios::end);
  f.write(&c, 1);
}

TEST_CASE("tiers: a T2 entry corrupted on disk is detected by its checksum and recomputed") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  auto [first, r, want] = one_parent(m);
  testing::ScratchDir dir;
  store::DiskStore disk(dir.str());
  kv::PagePool pool(m.backend(), m.kv_layout(16), 8 * page);
  Engine e(m, pool);
  e.set_disk_store(&disk);
  e.set_tiers({0, kv::EvictionPolicy::Lru, size_t(64) << 20});
  const runtime::PrefillResult a = e.prefill(first);
  for (int i = 0; e.store().get(a.id).resident(); ++i) {
    REQUIRE(i < 20);
    e.prefill({text(m, fmt::format("Story {}: a dog ran to the park and played with a ball all day long.", i)), {}});
  }
  REQUIRE(e.tier_stats().t2.writes > 0);
  const std::string path = disk.entry_path(e.store().get(a.id).key);
  REQUIRE(std::filesystem::exists(path));
  flip_byte(path);
  r.parents = {{a.id}};
  const runtime::DecodeResult d = e.decode(r);
  CHECK(e.tier_stats().t2.bad == 1);
  CHECK(d.stats.n_recomputed == int(first.tokens.size()));
  CHECK(testing::bit_identical(want, d.logits));
}

TEST_CASE("tiers: a call's metrics count the parent tokens loaded back and recomputed") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  for (size_t t1_pages : {size_t(0), size_t(100)}) {
    CAPTURE(t1_pages);
    kv::PagePool pool(m.backend(), m.kv_layout(16), 8 * page);
    Engine e(m, pool);
    e.set_tiers({t1_pages * page, kv::EvictionPolicy::Lru});
    const PrefillRequest first{text(m, "Once upon a time there was a little girl named Lily who loved the sea and the sun."), {}};
    const runtime::PrefillResult a = e.prefill(first);
    // Fill T0 with other messages until `a` has been evicted.
    for (int i = 0; e.store().get(a.id).resident(); ++i) {
      REQUIRE(i < 20);
      e.prefill({text(m, fmt::format("Story {}: a dog ran to the park and played with a ball all day long.", i)), {}});
    }
    DecodeRequest r;
    r.header = text(m, " She");
    r.parents = {{a.id}};
    r.max_tokens = 4;
    const runtime::DecodeResult d = e.decode(r);
    const int n_a = int(first.tokens.size());
    CHECK(d.stats.n_reused == n_a);
    if (t1_pages == 0) {
      CHECK(d.stats.n_recomputed == n_a);
      CHECK(d.stats.n_loaded == 0);
    } else {
      CHECK(d.stats.n_loaded == n_a);
      CHECK(d.stats.n_recomputed == 0);
    }
    CHECK(d.stats.n_loaded_from == std::array<int, 4>{0, d.stats.n_loaded, 0, 0});  // all of it from T1
    CHECK(d.stats.n_computed == int(r.header.size()) + int(d.generated.size()));
  }
}

TEST_CASE("tiers: a decode cancelled mid-way ends at once with what it generated and its batch goes on unchanged") {
  const model::Model& m = *testing::stories260k().model;
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(64) << 20);
  Engine e(m, pool);
  const runtime::PrefillResult story = e.prefill({text(m, "Once upon a time there was a little girl named Lily."), {}});
  DecodeRequest r;
  r.header = text(m, " She");
  r.parents = {{story.id}};
  r.max_tokens = 12;
  r.sampling.temperature = 0;
  const runtime::DecodeResult alone = e.decode(r);
  REQUIRE(alone.generated.size() == 12);  // not vacuous: the cancelled call would have gone on
  DecodeRequest cancelled = r;
  int drawn = 0;
  cancelled.on_token = [&](model::Token) { ++drawn; };
  cancelled.cancelled = [&] { return drawn >= 3; };
  const std::vector<runtime::DecodeResult> both = e.decode_batch(std::vector<DecodeRequest>{r, cancelled});
  CHECK(both[0].generated == alone.generated);
  CHECK(both[1].stop_reason == "cancelled");
  CHECK(both[1].generated == std::vector<model::Token>(alone.generated.begin(), alone.generated.begin() + 3));
  CHECK(e.store().get(both[1].id).complete());
}

TEST_CASE("tiers: a prefill batch larger than T0 runs in parts, with the encodings of one batch") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  std::vector<PrefillRequest> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({text(m, fmt::format("Story {}: once upon a time a little dog named Max ran to the park "
                                         "and played with a red ball in the sun all day long.", i)), {}});
  auto pages_of = [&](size_t t0_bytes) {
    kv::PagePool pool(m.backend(), m.kv_layout(16), t0_bytes);
    Engine e(m, pool);
    std::vector<std::vector<float>> out;
    for (const runtime::PrefillResult& r : e.prefill_batch(batch)) {
      e.prefetch(r.id);
      const kv::Message& msg = e.store().get(r.id);
      out.push_back(testing::page_floats(msg.pages));
    }
    return out;
  };
  const std::vector<std::vector<float>> whole = pages_of(size_t(64) << 20);
  const std::vector<std::vector<float>> parts = pages_of(8 * page);  // the batch needs 20 pages
  REQUIRE(whole.size() == parts.size());
  for (size_t i = 0; i < whole.size(); ++i) CHECK(testing::bit_identical(whole[i], parts[i]));
}

TEST_CASE("tiers: a working set that cannot fit in T0 is an InputError naming the budget") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  kv::PagePool pool(m.backend(), m.kv_layout(16), 6 * page);
  Engine e(m, pool);
  const kv::MessageId a = e.prefill({text(m, "Once upon a time there was a little girl named Lily who loved the sea."), {}}).id;
  const kv::MessageId b = e.prefill({text(m, "She had a red ball and a big dog called Max who liked to run and jump."), {}}).id;
  DecodeRequest r;
  r.header = text(m, " Then");
  r.parents = {{a}, {b}};
  r.max_tokens = 64;  // parents and the growing decode need more than 6 pages
  try {
    e.decode(r);
    FAIL("expected an InputError");
  } catch (const InputError& err) {
    const std::string what = err.what();
    CHECK(what.find("KV cache budget (T0)") != std::string::npos);
    CHECK(what.find("MiB") != std::string::npos);
    CHECK(what.find("message") != std::string::npos);
  }
  // The engine still works after the failed call.
  r.max_tokens = 2;
  r.parents = {{a}};
  CHECK(e.decode(r).generated.size() == 2);
}

TEST_CASE("tiers: the eviction order follows the policy (KVFlow priorities worked out by hand)") {
  // A small step graph: agent X runs next (step 0), Y in 1 step, Z in 3; W's message is never read again.
  // m1: X's dynamic suffix, steps 0.      m2: a prefix shared by Y and Z: min(1, 3) = 1, shared.
  // m3: Y's suffix, steps 1.              m4: Z's suffix, steps 3.
  // m5: never read again.                 m6: released (a recipe only).
  // m7: a prefix shared by Z only, steps 3, shared.
  using C = kv::EvictionCandidate;
  const std::vector<C> base = {
      {1, 0, false, false, 70}, {2, 1, true, false, 10}, {3, 1, false, false, 60}, {4, 3, false, false, 20},
      {5, std::nullopt, false, false, 90}, {6, std::nullopt, false, true, 95}, {7, 3, true, false, 5},
  };
  std::vector<C> workflow = base;
  kv::order_for_eviction(workflow, kv::EvictionPolicy::Workflow);
  std::vector<kv::MessageId> got;
  for (const C& c : workflow) got.push_back(c.id);
  // Released first; then never-again; then most steps (Z's suffix before Z's shared prefix); then Y's
  // suffix before the prefix Y shares; X's message last.
  CHECK(got == std::vector<kv::MessageId>{6, 5, 4, 7, 3, 2, 1});
  std::vector<C> lru = base;
  kv::order_for_eviction(lru, kv::EvictionPolicy::Lru);
  got.clear();
  for (const C& c : lru) got.push_back(c.id);
  CHECK(got == std::vector<kv::MessageId>{6, 7, 2, 4, 3, 1, 5});
}

/// A workflow's view of the messages, written down: steps to execution and hints per message.
struct Written final : runtime::StepOracle {
  std::map<kv::MessageId, size_t> steps;
  std::map<kv::MessageId, kv::Retention> hints;
  std::optional<size_t> steps_to_execution(kv::MessageId id) const override {
    auto it = steps.find(id);
    return it == steps.end() ? std::nullopt : std::optional<size_t>(it->second);
  }
  std::optional<kv::Retention> retention(kv::MessageId id) const override {
    auto it = hints.find(id);
    return it == hints.end() ? std::nullopt : std::optional<kv::Retention>(it->second);
  }
};

/// Prefills one ~30-token message (two 16-token pages on stories260K).
kv::MessageId filler(Engine& e, int i) {
  const model::Model& m = e.model();
  return e.prefill({text(m, fmt::format("Story {}: a dog ran to the park and played with a ball all day long.", i)), {}}).id;
}

TEST_CASE("tiers: workflow hints: a pinned message stays, the lower priority goes first, released and expired go first") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  kv::PagePool pool(m.backend(), m.kv_layout(16), 8 * page);  // BOS and three fillers fit
  Written w;
  SUBCASE("pin") {
    Engine e(m, pool, runtime::Mode::Choreo);
    e.set_tiers({0, kv::EvictionPolicy::Lru});
    e.step_oracles().add(&w);
    const kv::MessageId a = filler(e, 0);  // the oldest: LRU's first victim
    w.hints[a].pin = true;
    for (int i = 1; i < 12; ++i) {
      filler(e, i);
      CHECK(e.store().get(a).resident());
    }
    CHECK(e.tier_stats().t0_evictions > 0);
    e.step_oracles().remove(&w);  // the workflow ended: the pin is gone with it
    for (int i = 12; e.store().get(a).resident(); ++i) {
      REQUIRE(i < 30);
      filler(e, i);
    }
  }
  SUBCASE("a pinned working set that cannot fit is an InputError naming the pinned messages") {
    Engine e(m, pool, runtime::Mode::Choreo);
    e.step_oracles().add(&w);
    for (int i = 0; i < 3; ++i) w.hints[filler(e, i)].pin = true;  // 6 of 8 pages pinned (BOS holds one)
    try {
      filler(e, 3);
      FAIL("expected an InputError");
    } catch (const InputError& err) {
      CHECK(std::string(err.what()).find("pinned") != std::string::npos);
    }
    e.step_oracles().remove(&w);
  }
  SUBCASE("priority, release and ttl") {
    Engine e(m, pool, runtime::Mode::Choreo);
    e.set_tiers({0, kv::EvictionPolicy::Lru});
    e.step_oracles().add(&w);
    const kv::MessageId low = filler(e, 0), high = filler(e, 1), done = filler(e, 2);
    w.hints[high].priority = 5;  // older than `done` and `low`'s peer, but worth more
    w.hints[low].priority = 5;
    w.hints[done].release = true;  // no step reads it again: goes first, though it is the newest
    filler(e, 3);
    CHECK_FALSE(e.store().get(done).resident());
    CHECK(e.store().get(low).resident());
    CHECK(e.store().get(high).resident());
    w.hints[high].ttl_ms = 1.0;  // unused for longer than 1 ms: goes next, before unhinted `3`
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    filler(e, 4);
    CHECK_FALSE(e.store().get(high).resident());
    CHECK(e.store().get(low).resident());
    e.step_oracles().remove(&w);
  }
}

TEST_CASE("tiers: hints of several instances combine: any pin, the highest priority, a ttl only if all give one") {
  Written a, b;
  a.steps[7] = 1;
  b.steps[7] = 4;
  a.hints[7] = {false, 3, 1000.0, true};
  b.hints[7] = {true, -2, std::nullopt, true};
  runtime::StepOracleRegistry registry;
  registry.add(&a);
  std::optional<kv::Retention> r = registry.retention(7);
  REQUIRE(r);
  CHECK(r->ttl_ms == 1000.0);
  registry.add(&b);
  r = registry.retention(7);
  REQUIRE(r);
  CHECK(r->pin);
  CHECK(r->priority == 3);
  CHECK_FALSE(r->ttl_ms);  // b reads it and gives no ttl
  CHECK(r->release);
  CHECK_FALSE(registry.retention(8));
}

TEST_CASE("tiers: prefetch brings a message due soon back from T1 or T2 before its call, never evicting what is needed sooner") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  auto [first, r, want] = one_parent(m);
  for (const char* case_name : {"T1", "T2", "T2 corrupted", "all needed sooner"}) {
    const std::string name = case_name;
    CAPTURE(name);
    const bool t2 = name != "T1";
    testing::ScratchDir dir;
    store::DiskStore disk(dir.str());
    kv::PagePool pool(m.backend(), m.kv_layout(16), 8 * page);
    Engine e(m, pool);
    e.set_disk_store(&disk);
    kv::TierSettings tiers{t2 ? 0 : 100 * page, kv::EvictionPolicy::Workflow, t2 ? size_t(64) << 20 : 0};
    tiers.prefetch_steps = 2;
    e.set_tiers(tiers);
    Written w;
    e.step_oracles().add(&w);
    const kv::MessageId a = e.prefill(first).id;
    std::vector<kv::MessageId> fillers;
    for (int i = 0; e.store().get(a).resident(); ++i) {  // `a` is read by nobody yet: it leaves first
      REQUIRE(i < 20);
      fillers.push_back(filler(e, i));
    }
    if (name == "T2 corrupted") {
      const std::string path = disk.entry_path(e.store().get(a).key);
      REQUIRE(std::filesystem::exists(path));
      flip_byte(path);
    }
    // `a` is now due in 1 step; the fillers are never read again, unless every one is needed now (and T0 is
    // full: a prefetch may always use free room).
    w.steps[a] = 1;
    if (name == "all needed sooner") {
      const size_t a_bytes = m.kv_layout(16).pages_for(first.tokens.size()) * page;
      for (int i = 0; pool.budget_bytes() - pool.bytes_in_use() >= a_bytes; ++i) {
        REQUIRE(i < 20);
        fillers.push_back(e.prefill({text(m, fmt::format("Tale {} of a cat.", i)), {}}).id);
      }
      for (kv::MessageId id : fillers) w.steps[id] = 0;
    }
    if (name != "all needed sooner") filler(e, 100);  // a batch: the prefetch starts before it
    r.parents = {{a}};
    const runtime::DecodeResult d = e.decode(r);
    CHECK(testing::bit_identical(want, d.logits));
    const kv::TierStats s = e.tier_stats();
    const int n_a = int(first.tokens.size());
    if (name == "all needed sooner") {
      CHECK(s.prefetches == 0);  // no room could be made: the call loads it itself
      CHECK(d.stats.n_loaded == n_a);
    } else if (name == "T2 corrupted") {
      CHECK(s.prefetches == 1);
      CHECK(s.prefetch_bad == 1);
      CHECK(s.t2.bad == 1);
      CHECK(d.stats.n_recomputed == n_a);
    } else {
      CHECK(s.prefetches == 1);
      CHECK(s.prefetch_used == 1);
      CHECK(s.prefetch_bad == 0);
      CHECK(d.stats.n_loaded == n_a);
      CHECK(d.stats.n_recomputed == 0);
      CHECK((t2 ? s.t2.hits : s.t1_hits) == 1);
    }
    e.step_oracles().remove(&w);
  }
}

TEST_CASE("tiers: every transfer is an event on its tier's trace track, as many as the counters say") {
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  testing::ScratchDir dir;
  store::DiskStore disk(dir.str());
  kv::PagePool pool(m.backend(), m.kv_layout(16), 8 * page);
  Engine e(m, pool);
  e.set_disk_store(&disk);
  e.set_tiers({4 * page, kv::EvictionPolicy::Lru, size_t(64) << 20});  // T1 for 4 pages, T2 below it
  const double t_start = steady_ms();
  std::vector<kv::MessageId> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(filler(e, i));
  for (int round = 0; round < 2; ++round) {
    std::reverse(ids.begin(), ids.end());  // the most recently evicted first: some are still in T1
    for (kv::MessageId id : ids) {
      DecodeRequest r;
      r.header = text(m, " Then");
      r.parents = {{id}};
      r.max_tokens = 2;
      e.decode(r);
    }
  }
  const double t_end = steady_ms();
  const kv::TierStats s = e.tier_stats();
  REQUIRE(s.t1_hits > 0);
  REQUIRE(s.t2.hits > 0);
  std::map<std::string, uint64_t> count;
  for (const kv::TierEvent& ev : e.tier_events()) {
    ++count[kv::track_name(ev)];
    CHECK(ev.start_ms >= t_start);
    CHECK(ev.end_ms >= ev.start_ms);
    CHECK(ev.end_ms <= t_end);
  }
  const size_t n_tracks = count.size();
  CHECK(count["evict to T1"] == s.t1_offloads);
  CHECK(count["evict to T2"] == s.t2.writes);
  CHECK(count["T1->T0"] == s.t1_hits);
  CHECK(count["T2->T0"] == s.t2.hits);
  CHECK(count["recompute"] == s.recomputes);
  // In the trace: a "KV tiers" process, a track per kind, one slice per event.
  const nlohmann::ordered_json trace = exec::trace_json({}, e.tier_events());
  std::map<int, std::string> track_of;
  size_t slices = 0;
  bool process = false;
  for (const auto& ev : trace["traceEvents"]) {
    if (ev["name"] == "process_name") process = ev["args"]["name"] == "KV tiers";
    if (ev["name"] == "thread_name") track_of[ev["tid"].get<int>()] = ev["args"]["name"].get<std::string>();
    if (ev["ph"] == "X") {
      ++slices;
      CHECK(track_of.count(ev["tid"].get<int>()) == 1);
    }
  }
  CHECK(process);
  CHECK(slices == e.tier_events().size());
  CHECK(track_of.size() == n_tracks);
}

TEST_CASE("tiers: T1 copies are charged to its budget and returned when dropped") {
  kv::HostTier tier(1000);
  kernels::Backend& backend = testing::cpu_backend();
  {
    kv::HostCopy a(tier, backend, 2, 400);  // 800 bytes
    CHECK(tier.bytes_in_use() == 800);
    CHECK_FALSE(tier.fits(400));
    kv::HostCopy b = std::move(a);
    CHECK(tier.bytes_in_use() == 800);
    b.reset();
    CHECK(tier.bytes_in_use() == 0);
    kv::HostCopy c(tier, backend, 1, 200);
    CHECK(tier.bytes_in_use() == 200);
  }
  CHECK(tier.bytes_in_use() == 0);
  CHECK(tier.peak_bytes() == 800);
  CHECK(kv::parse_eviction_policy("lru") == kv::EvictionPolicy::Lru);
  CHECK_THROWS_AS(kv::parse_eviction_policy("fifo"), InputError);
}

}  // namespace
}  // namespace choreo
