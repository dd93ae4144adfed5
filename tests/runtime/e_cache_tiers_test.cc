// E caches in the KV tiers (DESIGN.md §6, docs/store.md "Tiers"): the hidden states a `partial` cross-model
// plan starts from are charged to the tier of their message's fastest copy of KV, move to T1 and back with
// it, go to T2 and T3 in their message's entry and come back from there (with the pages, by a prefetch, or
// alone when a plan needs them), are dropped when no tier has room (the sender then recomputes them), and
// are saved only for messages that a reader on another model will read; another model's encodings of a
// message are prefetched when the message is due. A damaged E cache in T2 or T3 is found by its checksum.
// Every result is compared with a run whose T0 holds everything.

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include <doctest/doctest.h>

#include <filesystem>

#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/lora.h"
#include "runtime/model/synth_lora.h"
#include "runtime/store/disk_store.h"
#include "tests/runtime/redis_server.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using runtime::CrossModelPlan;
using runtime::DecodeRequest;
using runtime::DecodeResult;
using runtime::Engine;
using runtime::ModelSet;
using runtime::PrefillRequest;

const model::Model& base() { return *testing::stories260k().model; }

/// stories260K (model 0) and the same weights with a random adapter on layers 1-3 (model 1), which reads
/// model 0's messages through partial [2, 4).
struct Pair {
  testing::ScratchDir dir;
  std::string path = (dir.path / "sibling.gguf").string();
  model::LoraStack adapter;
  Pair() {
    model::SynthLoraSpec spec;
    spec.first_layer = 1;
    spec.end_layer = 4;
    spec.strength = 0.2f;
    model::write_synthetic_lora(base(), spec, path);
    adapter = model::LoraStack{{{model::LoraAdapter::load(path, base()), 1.0f}}};
  }
  ModelSet set() const {
    ModelSet s(base());
    s.add("sibling", base(), adapter);
    s.set_plan(0, 1, CrossModelPlan::partial(2, 4));
    return s;
  }
};

constexpr int kPageTokens = 16;
constexpr int kDocs = 6;

std::vector<model::Token> tokens(const std::string& s) { return base().vocab().tokenize(s, false); }

std::string document(int i) {
  static const char* kStories[] = {"Once upon a time there was a little girl named Lily who loved the sun.",
                                   "Tom had a red ball. He threw it high and his dog ran after it all day.",
                                   "The old tree in the park was home to a bird, a squirrel and a big owl.",
                                   "Sue baked a cake for her mom. It was sweet and soft, and mom was happy.",
                                   "A small boat sailed on the lake. The wind was calm and the water blue.",
                                   "Ben found a shiny key under his bed. He wondered what door it opened."};
  return kStories[i % 6];
}

/// What a run gave: the sibling's decodes over the base model's documents, read round-robin twice.
struct Outcome {
  std::vector<std::vector<model::Token>> generated;
  std::vector<std::vector<std::vector<float>>> logits;
  int n_e_recomputed = 0;
  kv::TierStats stats;
  size_t t0_budget = 0, t0_peak = 0, t1_peak = 0, t1_budget = 0;
};

size_t page_bytes() { return base().kv_layout(kPageTokens).page_bytes(); }

Outcome run(const Pair& pair, size_t t0_pages, size_t t1_bytes, store::DiskStore* t2 = nullptr,
            store::RedisStore* t3 = nullptr, bool write_through = false) {
  const ModelSet set = pair.set();
  kv::PagePool pool(base().backend(), base().kv_layout(kPageTokens), t0_pages * page_bytes());
  Engine e(set, pool);
  if (t2) e.set_disk_store(t2);
  if (t3) e.set_remote_store(t3);
  kv::TierSettings tiers{t1_bytes, kv::EvictionPolicy::Lru, t2 ? size_t(64) << 20 : 0};
  tiers.write_through = write_through;
  e.set_tiers(tiers);
  std::vector<kv::MessageId> docs;
  for (int i = 0; i < kDocs; ++i) {
    PrefillRequest p;
    p.tokens = tokens(document(i));
    docs.push_back(e.prefill(p).id);
  }
  Outcome out;
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < kDocs; ++i) {
      DecodeRequest d;
      d.header = tokens(" The end.");
      d.parents = {{docs[size_t(i)], 1}};
      d.model = 1;
      d.max_tokens = d.exact_tokens.emplace(4);
      d.record_logits = true;
      const DecodeResult r = e.decode(d);
      out.generated.push_back(r.generated);
      out.logits.push_back(r.logits);
      out.n_e_recomputed += r.stats.n_e_recomputed;
      e.release(r.id);
    }
  out.stats = e.tier_stats();
  out.t0_budget = pool.budget_bytes();
  out.t0_peak = pool.peak_bytes();
  out.t1_budget = t1_bytes;
  out.t1_peak = out.stats.t1_peak_bytes;
  return out;
}

void check_same(const Outcome& a, const Outcome& b) {
  CHECK(a.generated == b.generated);
  REQUIRE(a.logits.size() == b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    REQUIRE(a.logits[i].size() == b.logits[i].size());
    for (size_t k = 0; k < a.logits[i].size(); ++k)
      CHECK(std::memcmp(a.logits[i][k].data(), b.logits[i][k].data(), a.logits[i][k].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("E caches in the tiers: they move to T1 and back with their messages, within both budgets, and change no bit") {
  const Pair pair;
  const Outcome all_fit = run(pair, 4096, 0);
  CHECK(all_fit.stats.t0_evictions == 0);
  CHECK(all_fit.stats.e_saved == kDocs);  // every document: a partial plan of the sibling reads it
  CHECK(all_fit.stats.e_dropped == 0);
  CHECK(all_fit.n_e_recomputed == 0);
  // An E cache is one layer's hidden state per token: dim floats.
  size_t doc_tokens = 0;
  for (int i = 0; i < kDocs; ++i) doc_tokens += tokens(document(i)).size();
  CHECK(all_fit.stats.e_saved_bytes == doc_tokens * size_t(base().config().dim) * sizeof(float));

  // T0 holds a few documents; T1 holds them all: E caches go down and come back with their pages.
  const Outcome t1 = run(pair, 14, size_t(64) << 20);
  check_same(t1, all_fit);
  CHECK(t1.stats.t0_evictions > 0);
  CHECK(t1.stats.e_t1_offloads > 0);
  CHECK(t1.stats.e_t1_loads > 0);
  CHECK(t1.stats.e_dropped == 0);
  CHECK(t1.n_e_recomputed == 0);
  CHECK(t1.t0_peak <= t1.t0_budget);
  CHECK(t1.t1_peak <= t1.t1_budget);

  // No T1: an evicted document's E cache is dropped with its pages (recomputing the document makes it again).
  const Outcome t0_only = run(pair, 14, 0);
  check_same(t0_only, all_fit);
  CHECK(t0_only.stats.t0_evictions > 0);
  CHECK(t0_only.stats.e_dropped > 0);
  CHECK(t0_only.t0_peak <= t0_only.t0_budget);

  // T2 below T0: an evicted document's entry carries its E cache, and loading the pages brings it back;
  // the sender recomputes nothing.
  const testing::ScratchDir dir;
  store::DiskStore disk((dir.path / "store").string());
  const Outcome t2 = run(pair, 14, 0, &disk);
  check_same(t2, all_fit);
  CHECK(t2.stats.t2.hits > 0);
  CHECK(t2.stats.t2.e_writes > 0);
  CHECK(t2.stats.t2.e_loads > 0);
  CHECK(t2.stats.t2.e_load_bytes > 0);
  CHECK(t2.stats.e_dropped == 0);  // out of memory, but in the entries
  CHECK(t2.n_e_recomputed == 0);
  CHECK(t2.stats.e_recomputed_tokens == 0);

  // A T1 too small for a document's pages and E cache together: the E caches that do not fit are dropped,
  // never over the budget.
  const size_t tight = 3 * page_bytes();
  const Outcome small_t1 = run(pair, 14, tight);
  check_same(small_t1, all_fit);
  CHECK(small_t1.t1_peak <= tight);
  CHECK(small_t1.t0_peak <= small_t1.t0_budget);
}

TEST_CASE("E caches in the tiers: a message saves one only for the plans of the models that will read it") {
  const Pair pair;
  const ModelSet set = pair.set();
  kv::PagePool pool(base().backend(), base().kv_layout(kPageTokens), size_t(64) << 20);
  Engine e(set, pool);
  const auto prefill = [&](std::optional<std::vector<int>> read_by, int model = 0) {
    PrefillRequest p;
    p.tokens = tokens(document(int(e.store().size())));
    p.model = model;
    p.read_by = std::move(read_by);
    return e.prefill(p).id;
  };
  const kv::MessageId unknown = prefill(std::nullopt);
  const kv::MessageId own = prefill(std::vector<int>{0});
  const kv::MessageId sibling = prefill(std::vector<int>{0, 1});
  const kv::MessageId by_sibling = prefill(std::vector<int>{0}, 1);  // no plan from model 1
  const auto layers = [&](kv::MessageId id) {
    std::vector<int> out;
    for (const auto& [layer, rows] : e.store().get(id).e_cache) out.push_back(layer);
    return out;
  };
  CHECK(layers(unknown) == std::vector<int>{2});  // not known: every plan from its model
  CHECK(layers(own).empty());
  CHECK(layers(sibling) == std::vector<int>{2});
  CHECK(layers(by_sibling).empty());
  CHECK(e.tier_stats().e_saved == 2);
  // The sibling reading the message saved without one has the sender recompute it; the one with it does not.
  for (const auto& [id, recomputed] : {std::pair{own, true}, std::pair{sibling, false}}) {
    DecodeRequest d;
    d.header = tokens(" The end.");
    d.parents = {{id}};
    d.model = 1;
    d.max_tokens = d.exact_tokens.emplace(2);
    CHECK((e.decode(d).stats.n_e_recomputed > 0) == recomputed);
  }
}

/// A workflow over five documents d0..d4 in which agent a runs on the sibling (reading the base's messages
/// through partial [2, 4)) and agent b on the base: the given steps (one `decode: {...}` per line, each
/// with temperature 0 and 3 tokens) and output.
struct DocWorkflow {
  dsl::Workflow w;
  exec::WorkflowModels models;
};

DocWorkflow doc_workflow(const Pair& pair, const std::vector<std::string>& steps, const std::string& output) {
  std::string text = fmt::format(R"Y(
name: docs
models:
  sibling: {{lora: "{}", reuse: {{from: default, plan: partial, layers: [2, 4]}}}}
agents:
  a: {{model: sibling}}
  b:
messages:
)Y",
                                 pair.path);
  for (int i = 0; i < 5; ++i) text += fmt::format("  d{}: {{text: \"{}\"}}\n", i, document(i));
  text += "steps:\n";
  for (const std::string& step : steps)
    text += "  - decode: {" + step + ", max_tokens: 3, temperature: 0}\n";
  text += "output: \"" + output + "\"\n";
  // The workflow "lives" beside the adapter it names: files a workflow names must be in its directory.
  dsl::Workflow w = dsl::parse_workflow(text, (std::filesystem::path(pair.path).parent_path() / "test.yaml").string());
  exec::WorkflowModels models = exec::load_workflow_models(w, base(), {});
  return {std::move(w), std::move(models)};
}

TEST_CASE("E caches in the tiers: another model's encoding of a message is prefetched when the message is due") {
  const Pair pair;
  // The sibling (agent a) reads d0 and d2 twice, through its own partial encodings of them; between the reads
  // the base (agent b) reads other documents, so a small T0 evicts the sibling's encodings to T1.
  const DocWorkflow doc = doc_workflow(
      pair,
      {R"(as: x0, agent: a, parents: [d0], header: " The end.")", R"(as: x2, agent: a, parents: [d2], header: " The end.")",
       R"(as: y1, agent: b, parents: [d1], header: " The end.")", R"(as: y3, agent: b, parents: [d3], header: " The end.")",
       R"(as: y4, agent: b, parents: [d4], header: " The end.")", R"(as: z0, agent: a, parents: [d0], header: " Then")",
       R"(as: z2, agent: a, parents: [d2], header: " Then")"},
      "{{ x0 }}|{{ x2 }}|{{ z0 }}|{{ z2 }}");
  const dsl::Workflow& w = doc.w;
  const exec::WorkflowModels& models = doc.models;
  const auto run = [&](size_t t0_pages, kv::TierSettings tiers, size_t* copy_prefetches) {
    kv::PagePool pool(base().backend(), base().kv_layout(kPageTokens), t0_pages * page_bytes());
    Engine e(models.set, pool);
    e.set_tiers(tiers);
    exec::RunResult r = exec::run_workflow(w, e, {});
    for (const kv::TierEvent& ev : e.tier_events())
      if (ev.kind == kv::TierEvent::Kind::Prefetch && e.store().record(ev.message).source != kv::kNoMessage)
        ++*copy_prefetches;
    CHECK(pool.peak_bytes() <= pool.budget_bytes());
    return r;
  };
  size_t none = 0, prefetched = 0;
  const exec::RunResult all_fit = run(4096, {}, &none);
  const exec::RunResult tight =
      run(13, {size_t(64) << 20, kv::EvictionPolicy::Workflow, 0, /*prefetch_steps=*/2}, &prefetched);
  CHECK(tight.output == all_fit.output);
  REQUIRE(tight.messages.size() == all_fit.messages.size());
  for (size_t i = 0; i < tight.messages.size(); ++i) CHECK(tight.messages[i].tokens == all_fit.messages[i].tokens);
  CHECK(none == 0);
  CHECK(prefetched > 0);
}

/// The documents' content keys (as run() prefills them, over the BOS), from an engine of the pair.
std::vector<uint64_t> document_keys(const Pair& pair) {
  const ModelSet set = pair.set();
  kv::PagePool pool(base().backend(), base().kv_layout(kPageTokens), size_t(64) << 20);
  Engine e(set, pool);
  std::vector<uint64_t> keys;
  for (int i = 0; i < kDocs; ++i) {
    PrefillRequest p;
    p.tokens = tokens(document(i));
    keys.push_back(e.store().get(e.prefill(p).id).key);
  }
  return keys;
}

/// Flips one bit of the last float of every E cache an entry holds (the end of the entry's bytes).
void damage_e_cache(std::vector<uint8_t>& entry) {
  const store::ParsedEntry parsed = store::parse_entry(entry);
  REQUIRE(parsed.problem == store::EntryProblem::Ok);
  REQUIRE(!parsed.meta.e_layers.empty());
  entry.back() ^= 0x10;
  CHECK(store::body_damage(entry, parsed) ==
        fmt::format("E cache checksum mismatch (layer {})", parsed.meta.e_layers.back()));
}

TEST_CASE("E caches in the tiers: another run reads them from T2 with the documents, and a damaged one is recomputed") {
  const Pair pair;
  const Outcome all_fit = run(pair, 4096, 0);
  const testing::ScratchDir dir;
  const std::string path = (dir.path / "store").string();
  {
    store::DiskStore disk(path);
    const Outcome first = run(pair, 4096, 0, &disk, nullptr, /*write_through=*/true);
    check_same(first, all_fit);
    CHECK(first.stats.t2.e_writes == kDocs);
  }
  // A second engine finds the documents in T2 and loads them, E caches staying in the entries: the sibling's
  // plan reads them from there, and the sender recomputes nothing.
  {
    store::DiskStore disk(path);
    const Outcome second = run(pair, 4096, 0, &disk);
    check_same(second, all_fit);
    CHECK(second.stats.t2.e_loads == kDocs);
    CHECK(second.stats.t2.e_writes == 0);
    CHECK(second.n_e_recomputed == 0);
  }
  // The entries list their E caches, and `cache ls --verify` (list(true)) checks them.
  const std::vector<uint64_t> keys = document_keys(pair);
  store::DiskStore disk(path);
  for (const store::EntryInfo& info : disk.list(true)) {
    CHECK(info.problem == store::EntryProblem::Ok);
    const bool document = std::find(keys.begin(), keys.end(), info.key) != keys.end();
    CHECK(info.meta.e_layers == (document ? std::vector<uint32_t>{2} : std::vector<uint32_t>{}));
    CHECK(info.meta.e_dim == (document ? uint32_t(base().config().dim) : 0u));
  }
  // Damage one document's E cache on disk: its entry is unusable, it is encoded again, same bits.
  const std::string entry_path = disk.entry_path(keys[0]);
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(entry_path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  damage_e_cache(bytes);
  std::ofstream(entry_path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bytes.data()),
                                                                       std::streamsize(bytes.size()));
  bool flagged = false;
  for (const store::EntryInfo& info : disk.list(true))
    if (info.key == keys[0]) flagged = info.problem == store::EntryProblem::ECacheChecksum;
  CHECK(flagged);
  const Outcome damaged = run(pair, 4096, 0, &disk);
  check_same(damaged, all_fit);
  CHECK(damaged.stats.t2.bad >= 1);
  CHECK(damaged.stats.t2.e_loads == kDocs - 1);
  CHECK(damaged.n_e_recomputed == 0);  // the document encoded again saved its E cache anew
}

TEST_CASE("E caches in the tiers: a second engine reads them from T3 (Redis), and a damaged value is recomputed") {
  const Pair pair;
  const Outcome all_fit = run(pair, 4096, 0);
  testing::RedisServer server;
  store::RedisStore redis({"127.0.0.1", server.port(), testing::kRedisPassword});
  const Outcome first = run(pair, 4096, 0, nullptr, &redis);
  check_same(first, all_fit);
  CHECK(first.stats.t3.e_writes == kDocs);
  CHECK(first.stats.t3.e_write_bytes == first.stats.e_saved_bytes);

  const Outcome second = run(pair, 4096, 0, nullptr, &redis);
  check_same(second, all_fit);
  CHECK(second.stats.t3.e_loads == kDocs);
  CHECK(second.n_e_recomputed == 0);

  const std::vector<uint64_t> keys = document_keys(pair);
  std::optional<std::vector<uint8_t>> value = redis.get(keys[1]);
  REQUIRE(value);
  damage_e_cache(*value);
  REQUIRE(redis.put(keys[1], *value));
  const Outcome damaged = run(pair, 4096, 0, nullptr, &redis);
  check_same(damaged, all_fit);
  CHECK(damaged.stats.t3.bad >= 1);
  CHECK(damaged.stats.t3.e_loads == kDocs - 1);
  CHECK(damaged.n_e_recomputed == 0);
}

TEST_CASE("E caches in the tiers: a prefetch from T2 brings a document's E cache back with its pages") {
  const Pair pair;
  // The base (agent b) reads every document first, so a small T0 with no T1 sends them to T2 with their E
  // caches; then the sibling (agent a) reads d0 and d2, which are due and prefetched from T2.
  std::vector<std::string> steps;
  for (int i = 0; i < 5; ++i) steps.push_back(fmt::format(R"(as: y{0}, agent: b, parents: [d{0}], header: " The end.")", i));
  for (int i : {0, 2}) steps.push_back(fmt::format(R"(as: x{0}, agent: a, parents: [d{0}], header: " Then")", i));
  const DocWorkflow doc = doc_workflow(pair, steps, "{{ y0 }}|{{ y4 }}|{{ x0 }}|{{ x2 }}");
  const dsl::Workflow& w = doc.w;
  const exec::WorkflowModels& models = doc.models;
  const testing::ScratchDir dir;
  store::DiskStore disk((dir.path / "store").string());
  struct Ran {
    exec::RunResult result;
    kv::TierStats stats;
    size_t t2_prefetches = 0;
  };
  const auto run = [&](size_t t0_pages, kv::TierSettings tiers) {
    kv::PagePool pool(base().backend(), base().kv_layout(kPageTokens), t0_pages * page_bytes());
    Engine e(models.set, pool);
    e.set_disk_store(&disk);
    e.set_tiers(tiers);
    Ran out{exec::run_workflow(w, e, {}), e.tier_stats()};
    for (const kv::TierEvent& ev : e.tier_events())
      if (ev.kind == kv::TierEvent::Kind::Prefetch && ev.tier == 2) ++out.t2_prefetches;
    CHECK(pool.peak_bytes() <= pool.budget_bytes());
    return out;
  };
  const Ran all_fit = run(4096, {});
  const Ran tight = run(12, {0, kv::EvictionPolicy::Workflow, size_t(64) << 20, /*prefetch_steps=*/2});
  CHECK(tight.result.output == all_fit.result.output);
  REQUIRE(tight.result.messages.size() == all_fit.result.messages.size());
  for (size_t i = 0; i < tight.result.messages.size(); ++i)
    CHECK(tight.result.messages[i].tokens == all_fit.result.messages[i].tokens);
  CHECK(tight.stats.t2.e_writes > 0);
  CHECK(tight.t2_prefetches > 0);
  CHECK(tight.stats.t2.e_loads > 0);
  CHECK(tight.stats.e_recomputed_tokens == 0);
}

}  // namespace
}  // namespace choreo
