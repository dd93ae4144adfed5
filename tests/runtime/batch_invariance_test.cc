// Batch invariance: a call's logits do not depend on what else runs with it. A decode gives bit-identical
// logits alone, in a batch with other decodes of other lengths over other parents, and with 1 or 2 threads;
// so `choreo eval --shard` slices and `--concurrency` never change a row's result (kernels/cpu/attention.cc,
// "Batch invariance").

#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/session.h"
#include "tests/runtime/bits.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

using runtime::DecodeRequest;
using runtime::Engine;

std::vector<model::Token> words(const model::Model& m, const std::string& s) { return m.vocab().tokenize(s, false); }

/// A context of about `n_tokens` tokens: numbered sentences, so that every page holds different keys.
std::string long_text(int n_sentences, const char* topic) {
  std::string s;
  for (int i = 0; i < n_sentences; ++i)
    s += "Sentence " + std::to_string(i) + " is about the " + topic + " and the number " + std::to_string(i * 7) + ". ";
  return s;
}

/// Every step's logits of each request, decoded as one batch on a fresh engine with `threads` threads.
std::vector<std::vector<std::vector<float>>> decode_all(testing::LoadedModel& lm, int threads,
                                                        const std::vector<std::string>& contexts,
                                                        const std::vector<std::string>& headers,
                                                        const std::vector<int>& which) {
  lm.backend->set_threads(threads);
  const model::Model& m = *lm.model;
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(512) << 20);
  Engine e(m, pool);
  std::vector<DecodeRequest> batch;
  for (int i : which) {
    DecodeRequest r;
    r.parents = {{e.prefill({words(m, contexts[size_t(i)]), {}, {}, "", kv::Visibility::Public}).id, {}, {}}};
    r.header = words(m, headers[size_t(i)]);
    r.sampling = {0.0f, 0, 1.0f, 7};
    r.exact_tokens = 6 + 3 * i;  // different lengths: the batch shrinks as calls finish
    r.record_logits = true;
    batch.push_back(r);
  }
  std::vector<std::vector<std::vector<float>>> logits;
  for (auto& result : e.decode_batch(batch)) logits.push_back(std::move(result.logits));
  lm.backend->set_threads(2);
  return logits;
}

using testing::bit_identical;

void check_invariance(testing::LoadedModel& lm, int n_sentences) {
  // Contexts of different lengths (the longest spans many attention chunks), so the calls of a batch see
  // different numbers of pages and leave the batch at different steps.
  const std::vector<std::string> contexts = {long_text(n_sentences, "sea"), long_text(n_sentences / 3, "forest"),
                                             long_text(n_sentences / 2, "city"), long_text(4, "sky")};
  const std::vector<std::string> headers = {" So the sea", " In the forest", " The city", " Up in the sky"};
  const auto alone = decode_all(lm, 2, contexts, headers, {0});
  const auto alone_1t = decode_all(lm, 1, contexts, headers, {0});
  const auto batch = decode_all(lm, 2, contexts, headers, {3, 0, 1, 2});
  const auto pair_1t = decode_all(lm, 1, contexts, headers, {0, 2});
  REQUIRE(alone.size() == 1);
  CHECK(alone[0].size() == 6);
  CHECK(bit_identical(alone[0], alone_1t[0]));  // 1 thread vs 2
  CHECK(bit_identical(alone[0], batch[1]));     // alone vs in a batch of 4
  CHECK(bit_identical(alone[0], pair_1t[0]));   // in a batch of 2 with 1 thread
  // And the others too: request 2 in the batch of 4 (2 threads) vs in the pair (1 thread).
  CHECK(bit_identical(batch[3], pair_1t[1]));
}

TEST_CASE("batch invariance: a decode's logits are bit-identical alone, in batches, with 1 or 2 threads (stories260K)") {
  check_invariance(testing::stories260k(), 16);  // ~330 tokens: 11 pages of 32, 2 attention chunks
}

TEST_CASE("batch invariance on the CUDA kernels (block emulator): a decode's logits are bit-identical alone and in batches (stories260K)") {
  // ~330 tokens: two of the attention kernel's 256-key splits for the longest context, one for the others.
  // The attention and the other kernels run in the emulator; the F32 products in the CPU GEMM that stands in
  // for cuBLASLt, whose pinned algorithm only the device case below can check.
  check_invariance(testing::stories260k_cuda_emulated(), 16);
}

TEST_CASE("batch invariance on a CUDA device: a decode's logits are bit-identical alone and in batches (stories260K)") {
  // On the GPU, cuBLASLt's pinned algorithm must keep a row's bits whatever the rows beside it
  // (kernels/cuda/device/gemm_lt.cu); nothing to do without one.
  if (testing::LoadedModel* device = testing::stories260k_cuda_device()) check_invariance(*device, 16);
}

TEST_CASE("batch invariance: a decode's logits are bit-identical alone, in batches, with 1 or 2 threads (SmolLM2)") {
  testing::LoadedModel lm(testing::require_file(testing::default_model()));
  check_invariance(lm, 70);  // ~1,400 tokens: 45 pages, 6 attention chunks
}

TEST_CASE("batch invariance: a prompt evaluated in one pass, in 7-token steps or token by token gives the same bits") {
  // llama.cpp has this property too (tests/reference/llama_self_consistency.py: 1-token, 7-token and
  // 512-token batches give identical logits on SmolLM2 Q4_1).
  testing::LoadedModel lm(testing::require_file(testing::default_model()));
  const model::Model& m = *lm.model;
  const std::vector<model::Token> prompt = m.vocab().tokenize(long_text(30, "hills"), true);
  REQUIRE(prompt.size() > 8 * 32);  // more than one attention chunk
  auto run = [&](size_t step) {
    kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(256) << 20);
    model::Session session(m, pool);
    std::vector<float> logits;
    for (size_t i = 0; i < prompt.size(); i += step)
      session.eval(std::span<const model::Token>(prompt.data() + i, std::min(step, prompt.size() - i)), &logits);
    return logits;
  };
  const std::vector<float> one_pass = run(prompt.size());
  CHECK(run(7) == one_pass);
  CHECK(run(1) == one_pass);
}

TEST_CASE("prefix scopes: the prefix baseline reuses only its own scope, so a call's result ignores other scopes") {
  testing::LoadedModel& lm = testing::stories260k();
  const model::Model& m = *lm.model;
  const std::string shared = long_text(10, "sea");
  auto call = [&](Engine& e, const std::string& tail, uint64_t scope) {
    DecodeRequest r;
    r.parents = {{e.prefill({words(m, shared + tail), {}, {}, "", kv::Visibility::Public}).id, {}, {}}};
    r.header = words(m, " And then");
    r.sampling = {0.0f, 0, 1.0f, 7};
    r.exact_tokens = 5;
    r.record_logits = true;
    r.prefix_scope = scope;
    return e.decode(r);
  };
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(256) << 20);
  Engine e(m, pool, runtime::Mode::Prefix);
  const uint64_t a = e.new_prefix_scopes(2), b = a + 1;
  CHECK(a > 0);
  call(e, " The end.", a);
  const auto same_scope = call(e, " The start.", a);
  const auto other_scope = call(e, " The start.", b);
  CHECK(same_scope.stats.n_reused > 100);  // the shared text comes from the first call
  CHECK(other_scope.stats.n_reused == 0);  // nothing of scope a is visible to scope b
  // Scope b's call equals the same call on a fresh engine, bit for bit.
  kv::PagePool fresh_pool(m.backend(), m.kv_layout(32), size_t(256) << 20);
  Engine fresh(m, fresh_pool, runtime::Mode::Prefix);
  CHECK(bit_identical(other_scope.logits, call(fresh, " The start.", 0).logits));
}

}  // namespace
}  // namespace choreo
