// Properties of the plain KV-cache path: a prompt's logits do not depend on how it is split into
// micro-batches, and sampling is reproducible from its seed.

#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "kernels/backend.h"
#include "runtime/kv/page_pool.h"
#include "common/error.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

TEST_CASE("logits are the same whether a prompt is evaluated at once, in micro-batches, or token by token") {
  auto backend = kernels::make_cpu_backend(2);
  auto m = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend);
  std::vector<model::Token> toks = m->vocab().tokenize(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big red ball under a tree.", true);
  REQUIRE(toks.size() > 40);
  kv::PagePool pool(m->backend(), m->kv_layout(8), size_t(256) << 20);  // small pages: many page boundaries

  std::vector<float> whole, last;
  model::Session a(*m, pool);
  a.eval(toks, &last, &whole);

  std::vector<float> chunked;
  model::Session b(*m, pool, 7);
  b.eval(toks, &last, &chunked);
  CHECK(max_abs_diff(whole, chunked) < 1e-4);

  std::vector<float> stepwise;
  model::Session c(*m, pool);
  for (model::Token t : toks) {
    c.eval(std::span<const model::Token>(&t, 1), &last);
    stepwise.insert(stepwise.end(), last.begin(), last.end());
  }
  CHECK(max_abs_diff(whole, stepwise) < 1e-4);
}

TEST_CASE("context overflow is an input error, not a crash") {
  auto backend = kernels::make_cpu_backend(1);
  auto m = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend);
  kv::PagePool pool(m->backend(), m->kv_layout(32), size_t(256) << 20);
  model::Session s(*m, pool);
  std::vector<model::Token> toks(m->config().n_ctx_train + 1, 1);
  std::vector<float> logits;
  CHECK_THROWS_AS(s.eval(toks, &logits), InputError);
  std::vector<model::Token> bad = {1, 999999};
  CHECK_THROWS_AS(s.eval(bad, &logits), InputError);
}

TEST_CASE("sampling: greedy is argmax, a seed reproduces a draw, top-k=1 is greedy, top-p keeps the head") {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -3.0f, 0.5f};
  model::Sampler greedy({0.0f, 40, 0.95f, 1});
  CHECK(greedy.sample(logits) == 1);
  model::Sampler top1({1.5f, 1, 1.0f, 7});
  for (int i = 0; i < 20; ++i) CHECK(top1.sample(logits) == 1);
  // top_p small enough to keep only the most likely token.
  model::Sampler narrow({1.0f, 0, 0.1f, 3});
  for (int i = 0; i < 20; ++i) CHECK(narrow.sample(logits) == 1);
  model::Sampler x({1.0f, 0, 1.0f, 42}), y({1.0f, 0, 1.0f, 42});
  std::vector<model::Token> dx, dy;
  for (int i = 0; i < 50; ++i) {
    dx.push_back(x.sample(logits));
    dy.push_back(y.sample(logits));
  }
  CHECK(dx == dy);
  // Empirical frequencies follow softmax(logits / T) (chi-square-free check: within 3 sigma of each p).
  model::Sampler z({1.0f, 0, 1.0f, 5});
  std::vector<int> counts(logits.size());
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[z.sample(logits)]++;
  double total = 0;
  for (float l : logits) total += std::exp(double(l));
  for (size_t i = 0; i < logits.size(); ++i) {
    double p = std::exp(double(logits[i])) / total;
    CHECK(std::abs(counts[i] / double(n) - p) < 3 * std::sqrt(p * (1 - p) / n) + 1e-3);
  }
}

}  // namespace
}  // namespace choreo
