// KV tiers never change results (issue 11): every shipped and corpus workflow, four instances at once in
// choreo mode, gives bit-identical texts, tokens and logits with a T0 budget well below its working set,
// under both eviction policies, with nothing, T1 or T2 below T0, as with a budget nothing has to leave.

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/instances.h"
#include "runtime/exec/interpreter.h"
#include "runtime/exec/workflow_models.h"
#include "runtime/kv/page_pool.h"
#include "runtime/store/disk_store.h"
#include "tests/runtime/bits.h"
#include "tests/runtime/workflow_cases.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

constexpr int kInstances = 4;

struct Observed {
  std::vector<exec::InstanceOutcome> outcomes;
  kv::TierStats stats;
  size_t t0_peak = 0;
  std::string error;  // the first instance error, if any
};

Observed run(const dsl::Workflow& workflow, const model::Model& m, const exec::RunArguments& arguments,
             size_t t0_bytes, const kv::TierSettings& tiers, kernels::DType k_type = kernels::DType::F32,
             kernels::DType v_type = kernels::DType::F32) {
  kv::PagePool pool(m.backend(), m.kv_layout(16, k_type, v_type), t0_bytes);
  testing::ScratchDir dir;
  store::DiskStore disk(dir.str());
  const exec::WorkflowModels models = exec::load_workflow_models(workflow, m, {});  // its `models:` beside m
  runtime::Engine engine(models.set, pool, runtime::Mode::Choreo);
  if (tiers.disk_bytes > 0) engine.set_disk_store(&disk);
  engine.set_tiers(tiers);
  exec::InstancesOptions options;
  options.concurrency = kInstances;
  options.hooks = [](size_t) {
    exec::RunHooks h;
    h.exact_tokens = [](const std::string&) { return std::optional<int>(6); };
    h.record_logits = [](const std::string&) { return true; };
    return h;
  };
  Observed o;
  o.outcomes = exec::run_instances(workflow, engine, std::vector<exec::RunArguments>(kInstances, arguments), options);
  for (const exec::InstanceOutcome& out : o.outcomes) {
    if (!out.error || !o.error.empty()) continue;
    try {
      std::rethrow_exception(out.error);
    } catch (const std::exception& e) {
      o.error = e.what();
    }
  }
  o.stats = engine.tier_stats();
  o.t0_peak = pool.peak_bytes();
  return o;
}

std::vector<exec::MessageRecord> without_modules(const std::vector<exec::MessageRecord>& records) {
  std::vector<exec::MessageRecord> out;
  for (const exec::MessageRecord& r : records)
    if (r.kind != "module") out.push_back(r);
  return out;
}

TEST_CASE("tiers never change results: every shipped and corpus workflow, tight T0, both policies, with nothing, T1 or T2 below, prefetch and write-through") {
  const testing::InputPolicyScope allow(testing::shared_models_dir());  // solvecheck.yaml's adapter (../shared/models)
  size_t n_compared = 0;
  uint64_t evictions = 0, recomputes = 0, reloads = 0, disk_loads = 0, prefetches = 0, prefetch_used = 0;
  for (const testing::WorkflowCase& c : testing::workflow_cases()) {
    CAPTURE(c.file);
    std::ifstream in(testing::require_file(c.file));
    std::stringstream source;
    source << in.rdbuf();
    const dsl::Workflow workflow = dsl::parse_workflow(source.str(), c.file.string());
    const model::Model& m = c.chat ? *testing::smollm2().model : *testing::stories260k().model;
    const Observed ref = run(workflow, m, c.arguments, size_t(512) << 20, {});
    REQUIRE_MESSAGE(ref.error.empty(), ref.error);
    const size_t page = m.kv_layout(16).page_bytes();
    for (kv::EvictionPolicy policy : {kv::EvictionPolicy::Workflow, kv::EvictionPolicy::Lru}) {
      for (const char* below : {"nothing", "T1", "T2"}) {
        CAPTURE(kv::policy_name(policy));
        CAPTURE(below);
        const bool host = below == std::string("T1");
        kv::TierSettings tiers{host ? ref.t0_peak : 0, policy, below == std::string("T2") ? ref.t0_peak : 0};
        // The workflow policy prefetches what is due within 2 steps (in the background), LRU does not; with
        // T2, the workflow policy writes through.
        if (policy == kv::EvictionPolicy::Workflow) {
          tiers.prefetch_steps = 2;
          tiers.write_through = below == std::string("T2");
        }
        // The smallest of peak/4, peak/2, ... that holds every call's working set; a smaller one must fail
        // with the budget error, never otherwise.
        Observed got;
        size_t budget = std::max(ref.t0_peak / 4, 4 * page);
        for (;; budget *= 2) {
          got = run(workflow, m, c.arguments, budget, tiers);
          if (got.error.empty() || budget >= ref.t0_peak) break;
          REQUIRE_MESSAGE(got.error.find("KV cache budget (T0)") != std::string::npos, got.error);
        }
        REQUIRE_MESSAGE(got.error.empty(), got.error);
        CAPTURE(budget);
        if (budget < ref.t0_peak) CHECK(got.stats.t0_evictions > 0);
        evictions += got.stats.t0_evictions;
        recomputes += got.stats.recomputes;
        reloads += got.stats.t1_hits;
        disk_loads += got.stats.t2.hits;
        prefetches += got.stats.prefetches;
        prefetch_used += got.stats.prefetch_used;
        CHECK(got.stats.prefetch_bad == 0);
        CHECK(got.t0_peak <= budget);
        if (host) CHECK(got.stats.t1_peak_bytes <= tiers.host_bytes);
        for (size_t i = 0; i < ref.outcomes.size(); ++i) {
          // PML module records name the instance that encoded a module first, which is up to the threads.
          const std::vector<exec::MessageRecord> a = without_modules(ref.outcomes[i].result.messages);
          const std::vector<exec::MessageRecord> b = without_modules(got.outcomes[i].result.messages);
          REQUIRE(a.size() == b.size());
          for (size_t k = 0; k < a.size(); ++k) {
            CAPTURE(a[k].name);
            CHECK(a[k].text == b[k].text);
            CHECK(a[k].tokens == b[k].tokens);
            CHECK(testing::bit_identical(a[k].logits, b[k].logits));
            ++n_compared;
          }
        }
      }
    }
  }
  MESSAGE("tiers: " << n_compared << " messages compared; " << evictions << " evictions from T0, " << recomputes
                     << " recomputes, " << reloads << " reloads from T1, " << disk_loads << " from T2, "
                     << prefetches << " prefetches (" << prefetch_used << " used)");
  CHECK(recomputes > 0);
  CHECK(prefetches > 0);
  CHECK(prefetch_used > 0);
  CHECK(reloads > 0);
  CHECK(disk_loads > 0);
}

TEST_CASE("tiers move the stored bytes of f16 and q8_0 KV caches: evicted, reloaded or recomputed, the same bits") {
  // Three workflows on the chat model (stories260K's 8-wide heads cannot hold q8_0 blocks), with the KV
  // cache in q8_0 keys and f16 values, and in f16: under a tight T0 with T1 or T2 below, every message equals
  // the run that evicts nothing at the same types.
  size_t n_compared = 0, n_cases = 0;
  uint64_t evictions = 0;
  for (const testing::WorkflowCase& c : testing::workflow_cases()) {
    const std::string name = c.file.filename().string();
    if (name != "hello.yaml" && name != "madpar.yaml" && name != "travel.yaml") continue;
    ++n_cases;
    CAPTURE(c.file);
    std::ifstream in(testing::require_file(c.file));
    std::stringstream source;
    source << in.rdbuf();
    const dsl::Workflow workflow = dsl::parse_workflow(source.str(), c.file.string());
    const model::Model& m = *testing::smollm2().model;
    for (auto [k, v] : {std::pair{kernels::DType::Q8_0, kernels::DType::F16},
                        std::pair{kernels::DType::F16, kernels::DType::F16}}) {
      const Observed ref = run(workflow, m, c.arguments, size_t(512) << 20, {}, k, v);
      REQUIRE_MESSAGE(ref.error.empty(), ref.error);
      const size_t page = m.kv_layout(16, k, v).page_bytes();
      for (const char* below : {"T1", "T2"}) {
        CAPTURE(below);
        const bool host = below == std::string("T1");
        const kv::TierSettings tiers{host ? ref.t0_peak : 0, kv::EvictionPolicy::Workflow, host ? 0 : ref.t0_peak};
        Observed got;
        for (size_t budget = std::max(ref.t0_peak / 4, 4 * page);; budget *= 2) {
          got = run(workflow, m, c.arguments, budget, tiers, k, v);
          if (got.error.empty() || budget >= ref.t0_peak) break;
        }
        REQUIRE_MESSAGE(got.error.empty(), got.error);
        evictions += got.stats.t0_evictions;
        for (size_t i = 0; i < ref.outcomes.size(); ++i) {
          const std::vector<exec::MessageRecord> a = without_modules(ref.outcomes[i].result.messages);
          const std::vector<exec::MessageRecord> b = without_modules(got.outcomes[i].result.messages);
          REQUIRE(a.size() == b.size());
          for (size_t j = 0; j < a.size(); ++j) {
            CHECK(a[j].tokens == b[j].tokens);
            CHECK(testing::bit_identical(a[j].logits, b[j].logits));
            ++n_compared;
          }
        }
      }
    }
  }
  MESSAGE("typed KV tiers: " << n_compared << " messages compared over " << n_cases << " workflows; " << evictions
                             << " evictions from T0");
  CHECK(n_cases == 3);
  CHECK(evictions > 0);
}

TEST_CASE("tiers: `pin: true` in a workflow keeps a message in T0 for the whole run, and without it LRU evicts it") {
  const std::string text =
      "name: pinned\n"
      "messages:\n"
      "  doc: {text: \"Once upon a time there was a little girl named Lily who loved the sea and the sun.\"PIN}\n"
      "sampling: {temperature: 0, max_tokens: 4}\n"
      "steps:\n"
      "  - repeat: \"r in range(8)\"\n"
      "    steps:\n"
      "      - prefill: {as: \"note[r]\", text: \"Note {{ r }}: a dog ran to the park and played with a ball all day.\"}\n"
      "  - decode: {as: answer, header: \"The end:\", parents: [doc, \"note[7]\"]}\n";
  const model::Model& m = *testing::stories260k().model;
  const size_t page = m.kv_layout(16).page_bytes();
  for (bool pin : {true, false}) {
    CAPTURE(pin);
    std::string yaml = text;
    yaml.replace(yaml.find("PIN"), 3, pin ? ", pin: true" : "");
    const dsl::Workflow workflow = dsl::parse_workflow(yaml, "pinned.yaml");
    kv::PagePool pool(m.backend(), m.kv_layout(16), 9 * page);
    runtime::Engine engine(m, pool, runtime::Mode::Choreo);
    engine.set_tiers({0, kv::EvictionPolicy::Lru});
    kv::MessageId doc = kv::kNoMessage;
    bool always_resident = true;
    exec::RunHooks hooks;
    hooks.on_plan_batch = [&](size_t batch, const std::vector<kv::MessageId>& created) {
      if (batch == 0) doc = created.at(0);
      always_resident = always_resident && engine.store().get(doc).resident();
    };
    const exec::RunResult r = exec::run_workflow(workflow, engine, {}, hooks);
    CHECK(engine.tier_stats().t0_evictions > 0);
    CHECK(always_resident == pin);
  }
}

}  // namespace
}  // namespace choreo
