// The whole differentiable forward pass of a choreographed run (runtime/train/graph.h) on stories260K, in
// float64: the LoRA gradients that backward() gives equal central finite differences of forward()'s loss on
// random coordinates of every target, for a graph whose calls read reordered and overlapping parents at
// offsets, so that gradients reach the keys and values of cached parents. The float graph agrees with the
// double one.

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/lora.h"
#include "runtime/train/adapter_file.h"
#include "runtime/train/graph.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using model::LoraTarget;
using train::GraphMessage;

const train::FrozenModel& frozen() {
  static const train::FrozenModel f = train::FrozenModel::dequantise(*testing::stories260k().model);
  return f;
}

std::vector<int32_t> tokens(const std::string& s) { return testing::stories260k().model->vocab().tokenize(s, false); }

/// BOS; two documents encoded apart, both right after BOS; a call reading them reordered (B, then A), and
/// one reading both at the same offset (parallel placement) and then the first call's encoding; the two
/// calls' tokens predict their next tokens.
template <class T>
void build(train::Graph<T>& g) {
  const int bos = g.add({{testing::stories260k().model->vocab().bos()}, 0, {}, {}, true});
  const std::vector<int32_t> a = tokens("Once upon a time there was a cat."), b = tokens("Tom had a red ball.");
  const int da = g.add({a, 1, {{bos, 0}}, {}, true});
  const int db = g.add({b, 1, {{bos, 0}}, {}, true});
  const auto next = [](const std::vector<int32_t>& t) {
    std::vector<int32_t> out(t.begin() + 1, t.end());
    out.push_back(-1);
    return out;
  };
  const std::vector<int32_t> c = tokens(" The cat and Tom played.");
  const int reordered = int(1 + b.size() + a.size());
  const int call = g.add({c, reordered, {{bos, 0}, {db, 1}, {da, int(1 + b.size())}}, next(c), true});
  const std::vector<int32_t> d = tokens(" They were happy.");
  const int parallel = int(1 + a.size());
  g.add({d, parallel + int(c.size()),
         {{bos, 0}, {da, 1}, {db, 1, int(b.size()) - 2}, {call, parallel}},
         next(d), true});
}

TEST_CASE("train graph: LoRA gradients through a choreographed run equal finite differences in float64") {
  const train::FrozenModel& m = frozen();
  const std::vector<LoraTarget> all = {LoraTarget::Q,    LoraTarget::K,  LoraTarget::V,    LoraTarget::O,
                                       LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down, LoraTarget::Output};
  train::LoraParams<double> lora = train::LoraParams<double>::init(m, all, 2, 4.0f, 11);
  std::mt19937_64 rng(12);
  std::normal_distribution<double> d(0.0, 0.05);
  for (double* v : lora.values()) *v = d(rng);  // B nonzero too, so that every A has a gradient
  train::Graph<double> g(m, lora);
  build(g);
  const double loss = g.forward();
  CHECK(std::isfinite(loss));
  CHECK(g.n_targets() > 0);
  train::LoraParams<double> grads = lora.zeros_like();
  g.backward(grads);
  std::vector<double*> values = lora.values();
  const std::vector<double*> grad_values = grads.values();
  // Coordinates: a few random ones of every layer's every target (A and B), and of the output.
  std::vector<size_t> picks;
  size_t at = 0;
  const auto pick_from = [&](const std::optional<train::LoraParams<double>::Pair>& p) {
    if (!p) return;
    for (size_t n : {p->a.size(), p->b.size()}) {
      for (int k = 0; k < 2; ++k) picks.push_back(at + rng() % n);
      at += n;
    }
  };
  for (const auto& layer : lora.layers)
    for (const auto& p : layer) pick_from(p);
  pick_from(lora.output);
  REQUIRE(at == values.size());
  constexpr double h = 1e-5;
  double worst = 0;
  int nonzero = 0;
  for (size_t k : picks) {
    const double keep = *values[k];
    *values[k] = keep + h;
    const double up = g.forward();
    *values[k] = keep - h;
    const double down = g.forward();
    *values[k] = keep;
    const double numeric = (up - down) / (2 * h);
    const double err = std::abs(numeric - *grad_values[k]) / std::max(1e-3, std::abs(numeric));
    worst = std::max(worst, err);
    nonzero += std::abs(numeric) > 1e-6;
    CAPTURE(k);
    CHECK_MESSAGE(err < 1e-5, "analytic ", *grad_values[k], " numeric ", numeric);
  }
  MESSAGE("graph: worst relative error ", worst, " over ", picks.size(), " coordinates (", nonzero, " nonzero)");
  CHECK(nonzero > int(picks.size()) / 2);
}

TEST_CASE("train graph: the float graph's loss and gradients agree with the double graph's") {
  const train::FrozenModel& m = frozen();
  const std::vector<LoraTarget> targets = {LoraTarget::Q, LoraTarget::V, LoraTarget::Down};
  train::LoraParams<double> ld = train::LoraParams<double>::init(m, targets, 4, 8.0f, 21);
  std::mt19937_64 rng(22);
  std::normal_distribution<double> d(0.0, 0.05);
  for (double* v : ld.values()) *v = d(rng);
  train::LoraParams<float> lf = train::LoraParams<float>::init(m, targets, 4, 8.0f, 21);
  const std::vector<double*> vd = ld.values();
  const std::vector<float*> vf = lf.values();
  REQUIRE(vd.size() == vf.size());
  for (size_t i = 0; i < vd.size(); ++i) *vf[i] = float(*vd[i]);
  train::Graph<double> gd(m, ld);
  train::Graph<float> gf(m, lf);
  build(gd);
  build(gf);
  const double loss_d = gd.forward(), loss_f = gf.forward();
  CHECK(loss_f == doctest::Approx(loss_d).epsilon(1e-5));
  train::LoraParams<double> grad_d = ld.zeros_like();
  train::LoraParams<float> grad_f = lf.zeros_like();
  gd.backward(grad_d);
  gf.backward(grad_f);
  const std::vector<double*> gdv = grad_d.values();
  const std::vector<float*> gfv = grad_f.values();
  double scale = 0, worst = 0;
  for (double* v : gdv) scale = std::max(scale, std::abs(*v));
  for (size_t i = 0; i < gdv.size(); ++i) worst = std::max(worst, std::abs(double(*gfv[i]) - *gdv[i]));
  MESSAGE("float vs double gradients: worst |difference| ", worst, " of a largest ", scale);
  CHECK(worst <= 1e-4 * scale);
}

TEST_CASE("train graph: with activation recomputation the loss and every gradient are the same bits, in less memory") {
  const train::FrozenModel& m = frozen();
  const std::vector<LoraTarget> targets = {LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O,
                                           LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};
  train::LoraParams<float> lora = train::LoraParams<float>::init(m, targets, 4, 8.0f, 31);
  std::mt19937_64 rng(32);
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (float* v : lora.values()) *v = d(rng);
  train::Graph<float> kept(m, lora), recomputed(m, lora);
  recomputed.set_recompute(true);
  build(kept);
  build(recomputed);
  const double loss_kept = kept.forward(), loss_recomputed = recomputed.forward();
  CHECK(loss_kept == loss_recomputed);
  train::LoraParams<float> grad_kept = lora.zeros_like(), grad_recomputed = lora.zeros_like();
  kept.backward(grad_kept);
  recomputed.backward(grad_recomputed);
  const std::vector<float*> a = grad_kept.values(), b = grad_recomputed.values();
  REQUIRE(a.size() == b.size());
  size_t differ = 0, nonzero = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ += *a[i] != *b[i];
    nonzero += *a[i] != 0.0f;
  }
  CHECK(differ == 0);
  CHECK(nonzero > a.size() / 2);
  CHECK(train::Graph<float>::activation_bytes(m, 4, 100, true) * 4 < train::Graph<float>::activation_bytes(m, 4, 100, false));
}

TEST_CASE("train graph: pairs on a range of layers train what zero pairs elsewhere would leave them, and stop back-propagation there") {
  const train::FrozenModel& m = frozen();
  const std::vector<LoraTarget> targets = {LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O,
                                           LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};
  const int n_layers = m.config.n_layers;
  REQUIRE(n_layers >= 4);
  train::LoraParams<float> ranged = train::LoraParams<float>::init(m, targets, 4, 8.0f, 41, 2, 4);
  train::LoraParams<float> every = train::LoraParams<float>::init(m, targets, 4, 8.0f, 41);
  CHECK(ranged.lowest_layer() == 2);
  CHECK(every.lowest_layer() == 0);
  for (int l = 0; l < n_layers; ++l)
    for (const auto& p : ranged.layers[size_t(l)]) CHECK(bool(p) == (l == 2 || l == 3));
  // The same values in layers 2 and 3; elsewhere `every` keeps B at zero, so its products add nothing.
  std::mt19937_64 rng(42);
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (int l = 2; l < 4; ++l)
    for (size_t t = 0; t < targets.size(); ++t) {
      auto& p = *ranged.layers[size_t(l)][t];
      for (float& v : p.a) v = d(rng);
      for (float& v : p.b) v = d(rng);
      every.layers[size_t(l)][t] = p;
    }
  train::Graph<float> g_ranged(m, ranged), g_every(m, every);
  build(g_ranged);
  build(g_every);
  CHECK(g_ranged.forward() == g_every.forward());
  train::LoraParams<float> grad_ranged = ranged.zeros_like(), grad_every = every.zeros_like();
  g_ranged.backward(grad_ranged);
  g_every.backward(grad_every);
  size_t compared = 0, differ = 0, nonzero = 0;
  for (int l = 2; l < 4; ++l)
    for (size_t t = 0; t < targets.size(); ++t) {
      const auto &a = *grad_ranged.layers[size_t(l)][t], &b = *grad_every.layers[size_t(l)][t];
      for (size_t i = 0; i < a.a.size(); ++i, ++compared) differ += a.a[i] != b.a[i], nonzero += a.a[i] != 0.0f;
      for (size_t i = 0; i < a.b.size(); ++i, ++compared) differ += a.b[i] != b.b[i], nonzero += a.b[i] != 0.0f;
    }
  CHECK(differ == 0);
  CHECK(nonzero > compared / 2);
  // A range outside the model is refused.
  CHECK_THROWS_AS(train::LoraParams<float>::init(m, targets, 4, 8.0f, 41, 3, n_layers + 1), InputError);
  CHECK_THROWS_AS(train::LoraParams<float>::init(m, targets, 4, 8.0f, 41, 3, 3), InputError);
}

TEST_CASE("train graph: its loss is the engine's log-loss of the same teacher-forced calls, through an adapter written by write_adapter") {
  const model::Model& base = *testing::stories260k().model;
  const train::FrozenModel& m = frozen();
  const std::vector<LoraTarget> targets = {LoraTarget::Q,    LoraTarget::K,  LoraTarget::V,   LoraTarget::O,
                                           LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};
  train::LoraParams<float> lora = train::LoraParams<float>::init(m, targets, 2, 4.0f, 31);
  std::mt19937_64 rng(32);
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (float* v : lora.values()) *v = d(rng);
  const testing::ScratchDir dir;
  const std::string path = (dir.path / "tuned.gguf").string();
  train::write_adapter(base, lora, path);

  runtime::ModelSet set(base);
  const int tuned = set.add("tuned", base, model::LoraStack{{{model::LoraAdapter::load(path, base), 1.0f}}});
  kv::PagePool pool(base.backend(), base.kv_layout(16), size_t(64) << 20);
  runtime::Engine e(set, pool);
  const std::vector<int32_t> a = tokens("Once upon a time there was a cat."), b = tokens("Tom had a red ball.");
  const std::vector<int32_t> c = tokens(" The cat and Tom played."), dd = tokens(" They were happy.");
  const auto prefill = [&](const std::vector<int32_t>& t) {
    runtime::PrefillRequest p;
    p.tokens = t;
    p.model = tuned;
    return e.prefill(p).id;
  };
  const kv::MessageId da = prefill(a), db = prefill(b);
  double engine_loss = 0;
  const auto decode = [&](const std::vector<int32_t>& t, std::vector<runtime::Parent> parents) {
    runtime::DecodeRequest r;
    r.header = {t[0]};
    r.parents = std::move(parents);
    r.model = tuned;
    r.forced.assign(t.begin() + 1, t.end());
    r.max_tokens = int(r.forced.size());
    r.record_logits = true;
    const runtime::DecodeResult out = e.decode(r);
    REQUIRE(out.logits.size() == r.forced.size());
    for (size_t i = 0; i < r.forced.size(); ++i)
      engine_loss += train::cross_entropy<float>(out.logits[i].data(), 1, m.config.n_vocab, &r.forced[i], nullptr);
    return out.id;
  };
  const kv::MessageId call = decode(c, {{db, 1}, {da, int(1 + b.size())}});
  const int parallel = int(1 + a.size());
  decode(dd, {{da, 1}, {db, 1, int(b.size()) - 2}, {call, parallel}});

  train::Graph<float> g(m, lora);
  build(g);
  const double graph_loss = g.forward();
  MESSAGE("engine log-loss ", engine_loss, ", graph ", graph_loss);
  CHECK(graph_loss == doctest::Approx(engine_loss).epsilon(1e-4));
  // The adapter matters: without it the loss is another.
  train::LoraParams<float> none = lora.zeros_like();
  train::Graph<float> plain(m, none);
  build(plain);
  CHECK(std::abs(plain.forward() - graph_loss) > 1e-3);
}

}  // namespace
}  // namespace choreo
