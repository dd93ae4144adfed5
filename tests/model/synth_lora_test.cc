// Synthetic LoRA adapters (runtime/model/synth_lora.h): an adapter on chosen layers loads as any adapter does,
// adapts exactly those layers (the KV of every layer before them is the base model's, bit for bit), and is a
// function of its seed.

#include <doctest/doctest.h>

#include <filesystem>

#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/lora.h"
#include "runtime/model/synth_lora.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using model::LoraTarget;

/// Layer `layer` of every token's K and V of message `id`, as floats.
std::vector<float> layer_kv(runtime::Engine& e, kv::MessageId id, int layer) {
  const kv::Message& m = e.store().get(id);
  const kernels::KvLayout& kv = e.store().pool().layout();
  const std::vector<std::byte> host = m.pages.to_host(kv.pages_for(m.tokens.size()));
  std::vector<float> out, row(kv.kv_dim());
  for (size_t t = 0; t < m.tokens.size(); ++t) {
    const std::byte* page = host.data() + (t / size_t(kv.page_tokens)) * kv.page_bytes();
    kv.read_k(page, layer, int(t % size_t(kv.page_tokens)), row.data());
    out.insert(out.end(), row.begin(), row.end());
    kv.read_v(page, layer, int(t % size_t(kv.page_tokens)), row.data());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST_CASE("synth-lora: an adapter on layers 10-14 adapts those layers only, and is a function of its seed") {
  const model::Model& m = *testing::smollm2().model;
  testing::ScratchDir dir;
  model::SynthLoraSpec spec;
  spec.first_layer = 10;
  spec.end_layer = 15;
  spec.targets = model::parse_lora_targets("q,k,v,down");
  const std::string path = (dir.path / "synth.gguf").string();
  model::write_synthetic_lora(m, spec, path);
  const auto adapter = model::LoraAdapter::load(path, m);
  CHECK(adapter->n_pairs() == 5 * 4);
  for (int l = 0; l < m.config().n_layers; ++l) {
    CAPTURE(l);
    CHECK((adapter->find(l, LoraTarget::Q) != nullptr) == (l >= 10 && l < 15));
    CHECK(adapter->find(l, LoraTarget::O) == nullptr);
  }
  // Layers before 10 keep the base model's KV bit for bit; layer 10 on (K, V and what follows) differ.
  runtime::ModelSet set(m);
  set.add("synth", m, model::LoraStack{{{adapter, 1.0f}}});
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(64) << 20);
  runtime::Engine engine(set, pool);
  runtime::PrefillRequest r;
  r.tokens = m.vocab().tokenize("The adapter touches five layers in the middle.", false, true);
  const kv::MessageId base = engine.prefill(r).id;
  r.model = 1;
  const kv::MessageId adapted = engine.prefill(r).id;
  for (int l = 0; l < m.config().n_layers; ++l) {
    CAPTURE(l);
    CHECK((layer_kv(engine, base, l) == layer_kv(engine, adapted, l)) == (l < 10));
  }
  // The same seed writes the same adapter; another seed another.
  const std::string again = (dir.path / "again.gguf").string();
  model::write_synthetic_lora(m, spec, again);
  CHECK(model::LoraAdapter::load(again, m)->fingerprint() == adapter->fingerprint());
  spec.seed = 2;
  model::write_synthetic_lora(m, spec, again);
  CHECK(model::LoraAdapter::load(again, m)->fingerprint() != adapter->fingerprint());
}

TEST_CASE("synth-lora: layers outside the model, a bad rank or target are clear errors") {
  const model::Model& m = *testing::smollm2().model;
  testing::ScratchDir dir;
  const std::string path = (dir.path / "bad.gguf").string();
  model::SynthLoraSpec spec;
  spec.first_layer = 28;
  spec.end_layer = 31;
  CHECK_THROWS_AS(model::write_synthetic_lora(m, spec, path), InputError);
  spec = {};
  spec.rank = 0;
  CHECK_THROWS_AS(model::write_synthetic_lora(m, spec, path), InputError);
  spec.rank = 100000;
  CHECK_THROWS_AS(model::write_synthetic_lora(m, spec, path), InputError);
  CHECK_THROWS_AS(model::parse_lora_targets("q,kk"), InputError);
  CHECK(!std::filesystem::exists(path));
}

}  // namespace
}  // namespace choreo
