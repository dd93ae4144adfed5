// The sampling helpers through the Backend interface (top_k, softmax), checked against values computed here:
// a brute-force std::sort with the sampler's comparator for top_k, a float64 softmax, model::argmax, and
// model::Sampler::sample on the logits for the draws made from a backend's candidates. Written against
// kernels::Backend only, and run on every backend of testing::conformance_backends() (the CPU's, and the CUDA
// kernels in the block emulator, whose race detector and bounds checks would throw). Logits are drawn on a
// grid of 1/4 so that ties are common.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "kernels/backend.h"
#include "runtime/model/sampler.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

/// n values of normal(0, sigma) rounded to multiples of 1/4 (many ties).
std::vector<float> tied_logits(size_t n, uint32_t seed, float sigma = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = std::round(normal(rng) * 4.0f) / 4.0f;
  return v;
}

struct Picks {
  std::vector<int32_t> ids;
  std::vector<float> values;
};

/// top_k run on the backend over host logits ([rows, vocab]), the results downloaded.
Picks device_top_k(kernels::Backend& be, const std::vector<float>& logits, int rows, int vocab, int k) {
  const kernels::Buffer<float> in(be, logits);
  kernels::Buffer<int32_t> ids(be, size_t(rows) * size_t(k));
  kernels::Buffer<float> values(be, size_t(rows) * size_t(k));
  be.top_k(in.data(), rows, vocab, k, ids.data(), values.data());
  Picks p{std::vector<int32_t>(size_t(rows) * size_t(k)), std::vector<float>(size_t(rows) * size_t(k))};
  ids.download(p.ids);
  values.download(p.values);
  return p;
}

std::vector<float> device_softmax(kernels::Backend& be, const std::vector<float>& x, int rows, int n, float temperature) {
  const kernels::Buffer<float> in(be, x);
  kernels::Buffer<float> out(be, size_t(rows) * size_t(n));
  be.softmax(in.data(), rows, n, temperature, out.data());
  std::vector<float> host(size_t(rows) * size_t(n));
  out.download(host);
  return host;
}

/// The brute force: every index of a row sorted by (value descending, index ascending), the first k.
std::vector<int32_t> sorted_first(const float* row, int vocab, int k) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  order.resize(size_t(k));
  return order;
}

TEST_CASE("sampling: top_k gives each row's k largest logits as a full sort orders them, ties by the lower index") {
  struct Shape {
    int rows, vocab, k;
  };
  // A vocab not a multiple of the block size (1000), smaller than a block (5, 1), k = n_vocab, and a real vocab
  // size (SmolLM2's 49152).
  const Shape shapes[] = {{3, 1000, 1}, {3, 1000, 7}, {3, 1000, 40}, {1, 300, 300}, {2, 5, 5}, {1, 1, 1}, {2, 49152, 40}};
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    for (const Shape& s : shapes) {
      INFO(backend.name << ": " << s.rows << " rows of " << s.vocab << ", k = " << s.k);
      const std::vector<float> logits = tied_logits(size_t(s.rows) * size_t(s.vocab), uint32_t(s.vocab * 7 + s.k));
      const Picks p = device_top_k(backend.backend, logits, s.rows, s.vocab, s.k);
      int tied_neighbours = 0;
      for (int r = 0; r < s.rows; ++r) {
        const float* row = logits.data() + size_t(r) * size_t(s.vocab);
        const std::vector<int32_t> want = sorted_first(row, s.vocab, s.k);
        for (int j = 0; j < s.k; ++j) {
          const size_t at = size_t(r) * size_t(s.k) + size_t(j);
          CHECK(p.ids[at] == want[size_t(j)]);
          CHECK(p.values[at] == row[want[size_t(j)]]);
          if (j > 0 && row[want[size_t(j)]] == row[want[size_t(j - 1)]]) ++tied_neighbours;
        }
        // k = 1 is the argmax, the first index on ties.
        CHECK(p.ids[size_t(r) * size_t(s.k)] == model::argmax(std::span<const float>(row, size_t(s.vocab))));
      }
      if (s.k >= 40) CHECK(tied_neighbours > 0);  // the ties were really exercised
    }
  }
}

TEST_CASE("sampling: top_k and softmax give a row the same bits alone as in a batch of rows") {
  const int rows = 5, vocab = 1000, k = 16;
  const std::vector<float> logits = tied_logits(size_t(rows) * vocab, 11);
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    const std::string name = backend.name;
    CAPTURE(name);
    const Picks batch = device_top_k(backend.backend, logits, rows, vocab, k);
    const std::vector<float> probs = device_softmax(backend.backend, logits, rows, vocab, 0.8f);
    for (int r : {0, 2, 4}) {
      CAPTURE(r);
      const std::vector<float> row(logits.begin() + ptrdiff_t(r) * vocab, logits.begin() + ptrdiff_t(r + 1) * vocab);
      const Picks alone = device_top_k(backend.backend, row, 1, vocab, k);
      CHECK(std::equal(alone.ids.begin(), alone.ids.end(), batch.ids.begin() + ptrdiff_t(r) * k));
      CHECK(std::memcmp(alone.values.data(), batch.values.data() + size_t(r) * k, k * sizeof(float)) == 0);
      const std::vector<float> row_probs = device_softmax(backend.backend, row, 1, vocab, 0.8f);
      CHECK(std::memcmp(row_probs.data(), probs.data() + size_t(r) * vocab, vocab * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("sampling: softmax is a float64 softmax within 1e-6 relative, and each row sums to 1 within 1e-5") {
  struct Shape {
    int rows, n;
  };
  const Shape shapes[] = {{3, 1000}, {1, 49152}, {2, 7}};
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    for (const Shape& s : shapes) {
      for (float temperature : {0.5f, 1.0f, 1.7f}) {
        const std::string name = backend.name;
      CAPTURE(name);
        CAPTURE(s.n);
        CAPTURE(temperature);
        const std::vector<float> x = tied_logits(size_t(s.rows) * size_t(s.n), uint32_t(s.n + 3), 2.5f);
        const std::vector<float> out = device_softmax(backend.backend, x, s.rows, s.n, temperature);
        for (int r = 0; r < s.rows; ++r) {
          const float* row = x.data() + size_t(r) * size_t(s.n);
          const double max = *std::max_element(row, row + s.n);
          std::vector<double> e(static_cast<size_t>(s.n));
          double total = 0.0, sum_out = 0.0, worst = 0.0;
          for (int i = 0; i < s.n; ++i) total += e[size_t(i)] = std::exp((double(row[i]) - max) / temperature);
          for (int i = 0; i < s.n; ++i) {
            const double want = e[size_t(i)] / total, got = out[size_t(r) * size_t(s.n) + size_t(i)];
            worst = std::max(worst, std::abs(got - want) / want);
            sum_out += got;
          }
          CAPTURE(worst);
          CHECK(worst <= 1e-6);
          CHECK(std::abs(sum_out - 1.0) <= 1e-5);
        }
      }
    }
    // Equal values: every probability is 1/n.
    const std::vector<float> flat(300, 1.25f);
    for (float p : device_softmax(backend.backend, flat, 1, 300, 0.9f)) CHECK(p == doctest::Approx(1.0 / 300).epsilon(1e-6));
  }
}

TEST_CASE(
    "sampling: top_k refuses k outside 1..n_vocab and softmax a temperature that is not positive and "
    "finite") {
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    const std::string name = backend.name;
    CAPTURE(name);
    kernels::Backend& be = backend.backend;
    const kernels::Buffer<float> logits(be, tied_logits(64, 5));
    kernels::Buffer<int32_t> ids(be, 128);
    kernels::Buffer<float> values(be, 128), out(be, 64);
    for (int k : {0, -1, 65, 1000}) {
      CAPTURE(k);
      CHECK_THROWS_AS(be.top_k(logits.data(), 1, 64, k, ids.data(), values.data()), std::invalid_argument);
    }
    CHECK_THROWS_AS(be.top_k(logits.data(), -1, 64, 4, ids.data(), values.data()), std::invalid_argument);
    for (float t : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      CAPTURE(t);
      CHECK_THROWS_AS(be.softmax(logits.data(), 1, 64, t, out.data()), std::invalid_argument);
    }
    CHECK_THROWS_AS(be.softmax(logits.data(), 1, 0, 1.0f, out.data()), std::invalid_argument);
    // No rows: nothing to do, and no error.
    be.top_k(logits.data(), 0, 64, 64, ids.data(), values.data());
    be.softmax(logits.data(), 0, 64, 1.0f, out.data());
  }
}

TEST_CASE("sampling: Sampler::sample_candidates on a backend's top_k draws what Sampler::sample draws on the logits") {
  const int vocab = 500;
  const std::vector<float> logits = tied_logits(vocab, 23, 1.5f);
  struct Setting {
    float temperature;
    int top_k;
    float top_p;
  };
  // Greedy, top-k 1, a top-p cut, no top-p, no top-k (the whole vocabulary as candidates), a hot temperature.
  const Setting settings[] = {{0.8f, 40, 0.95f}, {0.0f, 40, 0.95f}, {0.7f, 1, 0.9f},
                              {1.5f, 5, 1.0f},   {1.0f, 0, 0.5f},   {3.0f, 64, 0.99f}};
  for (const testing::NamedBackend& backend : testing::conformance_backends()) {
    for (const Setting& s : settings) {
      INFO(backend.name << ": temperature " << s.temperature << ", top_k " << s.top_k << ", top_p " << s.top_p);
      const int k = s.top_k > 0 ? s.top_k : vocab;
      const Picks p = device_top_k(backend.backend, logits, 1, vocab, k);
      // More candidates than top_k: the extra ones are ignored.
      const Picks more = device_top_k(backend.backend, logits, 1, vocab, std::min(vocab, k + 24));
      std::set<model::Token> drawn;
      for (uint64_t seed = 0; seed < 50; ++seed) {
        const model::SamplingParams params{s.temperature, s.top_k, s.top_p, seed};
        model::Sampler on_logits(params), on_candidates(params), on_more(params);
        for (int draw = 0; draw < 3; ++draw) {  // the generators stay in step
          const model::Token want = on_logits.sample(logits);
          CHECK(on_candidates.sample_candidates(p.values, p.ids) == want);
          CHECK(on_more.sample_candidates(more.values, more.ids) == want);
          drawn.insert(want);
        }
      }
      // A stochastic setting draws more than one token, so the draws were really compared.
      if (s.temperature > 0.0f && s.top_k != 1) CHECK(drawn.size() > 1);
    }
  }
}

TEST_CASE("sampling: Sampler::sample_candidates refuses empty, unequal and unsorted candidates") {
  model::Sampler sampler(model::SamplingParams{});
  const std::vector<float> values = {3.0f, 2.0f, 2.0f}, empty;
  const std::vector<int32_t> ids = {4, 1, 7}, unsorted_ids = {4, 7, 1}, two = {4, 1}, no_ids;
  CHECK_THROWS_AS(sampler.sample_candidates(empty, no_ids), std::invalid_argument);
  CHECK_THROWS_AS(sampler.sample_candidates(values, two), std::invalid_argument);
  CHECK_THROWS_AS(sampler.sample_candidates(values, unsorted_ids), std::invalid_argument);
  const std::vector<float> ascending = {1.0f, 2.0f, 3.0f};
  CHECK_THROWS_AS(sampler.sample_candidates(ascending, ids), std::invalid_argument);
  const model::Token t = sampler.sample_candidates(values, ids);
  CHECK((t == 4 || t == 1 || t == 7));
}

}  // namespace
}  // namespace choreo
