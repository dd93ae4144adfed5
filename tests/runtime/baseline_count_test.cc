// The prefix-caching chat baseline's token count (runtime/exec/baseline_count.h): hand-worked cases, a
// brute-force recomputation on random runs, and the engine's own prefix mode, which runs that baseline.

#include "runtime/exec/baseline_count.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "dsl/workflow_parser.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "tests/test_models.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

exec::MessageRecord record(std::string name, std::string kind, std::vector<model::Token> tokens,
                           std::vector<std::string> parents, int generated = 0, double start = 0) {
  exec::MessageRecord m;
  m.name = std::move(name);
  m.kind = std::move(kind);
  m.tokens = std::move(tokens);
  m.parents = std::move(parents);
  m.n_generated = generated;
  m.start_ms = start;
  return m;
}

TEST_CASE("prefix baseline: hand-worked") {
  exec::RunResult r;
  r.messages.push_back(record("sys", "message", {1, 2, 3}, {}));
  r.messages.push_back(record("q", "prefill", {4, 5}, {"sys"}));  // no request: a chat API has no prefill
  // Decode a over [sys, q]: prompt BOS 1 2 3 4 5 + header 6, all computed (7); generated 7 8 9: 2 fed back.
  r.messages.push_back(record("a", "decode", {6, 7, 8, 9}, {"sys", "q"}, 3, 1));
  // Decode b over [sys, a], a later batch: prompt BOS 1 2 3 | 6 7 8 9 | 6 (9 tokens). The cache holds BOS 1
  // 2 3 4 5 6 7 8 (a's prompt and generation but its last token): shared prefix BOS 1 2 3 (4 tokens) ->
  // computes 5, plus 0 fed back (1 generated).
  r.messages.push_back(record("b", "decode", {6, 10}, {"sys", "a"}, 1, 2));
  // Decode c in the same batch as b, over [sys, q]: b's prompt is not cached yet; a's is: BOS 1 2 3 4 5
  // shared (6), header 11 computed (1), 2 generated: 1 fed back.
  r.messages.push_back(record("c", "decode", {11, 12, 13}, {"sys", "q"}, 2, 2));
  const exec::BaselineCount b = exec::prefix_baseline(r, 0);
  CHECK(b.calls == 3);
  CHECK(b.reused == 0 + 4 + 6);
  CHECK(b.computed == (7 + 2) + (5 + 0) + (1 + 1));
  CHECK(exec::prefix_baseline(r, -1).computed == (6 + 2) + (5 + 0) + (1 + 1));  // no BOS: 8 = 3 shared + 5
}

TEST_CASE("prefix baseline: a call on another model reuses nothing of the first model's cache") {
  exec::RunResult r;
  r.messages.push_back(record("sys", "message", {1, 2, 3}, {}));
  r.messages.push_back(record("a", "decode", {6, 7}, {"sys"}, 1, 1));   // BOS 1 2 3 6: computed
  r.messages.push_back(record("b", "decode", {8, 9}, {"sys"}, 1, 2));   // BOS 1 2 3 reused, 8 computed
  r.messages.push_back(record("c", "decode", {8, 9}, {"sys"}, 1, 3));
  r.messages.back().model = "math";  // the same prompt on another model: computed whole
  r.messages.push_back(record("d", "decode", {10, 11}, {"sys"}, 1, 4));
  r.messages.back().model = "math";  // then BOS 1 2 3 is cached for that model too
  const exec::BaselineCount b = exec::prefix_baseline(r, 0);
  CHECK(b.reused == 0 + 4 + 0 + 4);
  CHECK(b.computed == 5 + 1 + 5 + 1);
}

TEST_CASE("prefix baseline: equals a brute-force longest common prefix over random runs") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    exec::RunResult r;
    const int n_messages = 1 + int(rng() % 3);
    for (int i = 0; i < n_messages; ++i) {
      std::vector<model::Token> t(1 + rng() % 4);
      for (auto& x : t) x = model::Token(rng() % 3);
      r.messages.push_back(record("m" + std::to_string(i), "message", t, {}));
    }
    std::vector<std::pair<std::vector<model::Token>, double>> cached;  // sequence, batch
    int64_t computed = 0;
    const int n_decodes = 1 + int(rng() % 8);
    double batch = 0;
    for (int i = 0; i < n_decodes; ++i) {
      if (rng() % 2) batch += 1;
      std::vector<std::string> parents;
      std::vector<model::Token> prompt{9};
      for (size_t k = 0, n = rng() % 3; k < n; ++k) {
        const exec::MessageRecord& p = r.messages[rng() % r.messages.size()];
        parents.push_back(p.name);
        prompt.insert(prompt.end(), p.tokens.begin(), p.tokens.end());
      }
      std::vector<model::Token> tokens(1 + rng() % 3);
      for (auto& x : tokens) x = model::Token(rng() % 3);
      const int generated = int(rng() % tokens.size());
      prompt.insert(prompt.end(), tokens.begin(), tokens.end() - generated);
      size_t best = 0;
      for (const auto& [seq, at] : cached) {
        if (at >= batch) continue;  // the same batch: not cached yet
        size_t k = 0;
        while (k < seq.size() && k < prompt.size() && seq[k] == prompt[k]) ++k;
        best = std::max(best, k);
      }
      computed += int64_t(prompt.size() - best) + std::max(generated - 1, 0);
      std::vector<model::Token> held = prompt;
      if (generated > 1) held.insert(held.end(), tokens.end() - generated, tokens.end() - 1);
      cached.push_back({held, batch});
      r.messages.push_back(record("d" + std::to_string(i), "decode", tokens, parents, generated, batch));
    }
    CAPTURE(trial);
    CHECK(exec::prefix_baseline(r, 9).computed == computed);
  }
}

TEST_CASE("prefix baseline: the engine's prefix mode computes the counted number (stories260K)") {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  const model::Model& m = *testing::stories260k().model;
  struct Case {
    const char* file;
    exec::RunArguments arguments;
  };
  for (const Case& c : {Case{"hello.yaml", {{{"question", "Why is the sky blue?"}}, {}}},
                        Case{"multiqa.yaml", {{{"document", "Tom has cats."}, {"questions", "['a?', 'b?']"}}, {}}},
                        Case{"madpar.yaml", {{{"problem", "What is 2 + 2?"}}, {{"rounds", "2"}}}}}) {
    CAPTURE(c.file);
    std::ifstream in(testing::require_file(std::filesystem::path(src ? src : ".") / "workflows" / c.file));
    std::stringstream text;
    text << in.rdbuf();
    kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(256) << 20);
    runtime::Engine engine(m, pool, runtime::Mode::Prefix);
    const exec::RunResult r = exec::run_workflow(dsl::parse_workflow(text.str(), c.file), engine, c.arguments);
    int64_t computed = 0;
    for (const exec::MessageRecord& rec : r.messages) computed += rec.n_computed;
    CHECK(exec::prefix_baseline(r, m.vocab().add_bos() ? m.vocab().bos() : -1).computed == computed);
  }
}

}  // namespace
}  // namespace choreo
