// The LoRA gradients of one training step of `choreo finetune train` on stories260K against an independent
// implementation (tests/reference/lora_grad_ref.py: numpy with PyPI's autograd, a dense formulation with
// keys re-rotated to their placements). The step is the choreographed run of a real trace of a workflow with
// parallel prefills and a decode that reads its parents reordered, as `train` builds it (trace_messages).

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsl/workflow_parser.h"
#include "runtime/kv/page_pool.h"
#include "runtime/train/finetune.h"
#include "runtime/train/graph.h"
#include "tests/reference/reference.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"
#include "tests/train/train_workflows.h"

namespace choreo {
namespace {

using model::LoraTarget;


constexpr const char* kTargetNames[] = {"q", "k", "v", "o", "gate", "up", "down"};

TEST_CASE("finetune gradients: one training step's LoRA gradients equal an independent autograd implementation") {
  const model::Model& base = *testing::stories260k().model;
  const dsl::Workflow w = dsl::parse_workflow(testing::kReorderedWorkflow, "gradref.yaml");
  // A real baseline trace (greedy), then the choreographed run's messages, as `finetune train` builds them.
  train::Trace trace;
  {
    kv::PagePool pool(base.backend(), base.kv_layout(16), size_t(64) << 20);
    runtime::Engine prefix(base, pool, runtime::Mode::Prefix);
    trace = train::sample_trace(w, prefix, {1, {}}, 0.0f, 0);
  }
  REQUIRE(trace.calls.size() == 2);
  std::vector<train::GraphMessage> messages;
  {
    kv::PagePool pool(base.backend(), base.kv_layout(16), size_t(64) << 20);
    runtime::Engine choreo(base, pool, runtime::Mode::Choreo);
    messages = train::trace_messages(w, choreo, trace);
  }
  const train::FrozenModel m = train::FrozenModel::dequantise(base);
  const std::vector<LoraTarget> targets = {LoraTarget::Q,    LoraTarget::K,  LoraTarget::V,   LoraTarget::O,
                                           LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};
  train::LoraParams<double> lora = train::LoraParams<double>::init(m, targets, 2, 4.0f, 41);
  std::mt19937_64 rng(42);
  std::normal_distribution<double> d(0.0, 0.05);
  for (double* v : lora.values()) *v = d(rng);

  train::Graph<double> g(m, lora);
  for (const train::GraphMessage& msg : messages) g.add(msg);
  const double loss = g.forward();
  train::LoraParams<double> grads = lora.zeros_like();
  g.backward(grads);

  // The reference's inputs: the weights (raw float32 and a manifest), the messages, the LoRA values.
  const testing::ScratchDir dir;
  const std::string weights_path = (dir.path / "weights.f32").string(), spec_path = (dir.path / "spec.json").string();
  nlohmann::json manifest = nlohmann::json::object();
  {
    std::ofstream out(weights_path, std::ios::binary);
    size_t at = 0;
    const auto put = [&](const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape) {
      out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
      manifest[name] = {at, shape};
      at += v.size();
    };
    const model::LlamaConfig& c = m.config;
    put("token_embd", m.token_embd, {c.n_vocab, c.dim});
    put("output", m.output, {c.n_vocab, c.dim});
    put("output_norm", m.output_norm, {c.dim});
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      put(p + "attn_norm", m.layers[size_t(l)].attn_norm, {c.dim});
      put(p + "ffn_norm", m.layers[size_t(l)].ffn_norm, {c.dim});
      for (int t = 0; t < train::kLayerTargets; ++t) {
        const auto [n_in, n_out] = m.shape(LoraTarget(t));
        put(p + kTargetNames[t], m.layers[size_t(l)].w[size_t(t)], {n_out, n_in});
      }
    }
  }
  nlohmann::json spec;
  spec["weights"] = manifest;
  spec["config"] = {{"dim", m.config.dim},
                    {"n_layers", m.config.n_layers},
                    {"n_heads", m.config.n_heads},
                    {"n_kv_heads", m.config.n_kv_heads},
                    {"head_dim", m.config.head_dim},
                    {"rms_eps", m.config.rms_eps},
                    {"rope_dims", m.rope.n_dims},
                    {"rope_base", m.rope.freq_base},
                    {"rope_factors", m.rope_factors},
                    {"rope_layout", m.rope.layout == kernels::RopeParams::Layout::Interleaved ? "interleaved" : "halves"}};
  nlohmann::json msgs = nlohmann::json::array();
  for (const train::GraphMessage& msg : messages) {
    nlohmann::json parents = nlohmann::json::array();
    for (const train::GraphMessage::Parent& p : msg.parents)
      parents.push_back({{"message", p.message},
                         {"offset", p.offset},
                         {"n_tokens", p.n_tokens >= 0 ? p.n_tokens : int(messages[size_t(p.message)].tokens.size())}});
    std::vector<int32_t> t = msg.targets;
    if (t.empty()) t.assign(msg.tokens.size(), -1);
    msgs.push_back({{"tokens", msg.tokens}, {"start_pos", msg.start_pos}, {"parents", parents}, {"targets", t},
                    {"lora", msg.lora}});
  }
  spec["messages"] = msgs;
  nlohmann::json order = nlohmann::json::array();
  for (int l = 0; l < m.config.n_layers; ++l)
    for (int t = 0; t < train::kLayerTargets; ++t)
      if (lora.layers[size_t(l)][size_t(t)]) {
        const auto [n_in, n_out] = m.shape(LoraTarget(t));
        order.push_back({{"key", std::to_string(l) + "." + kTargetNames[t]}, {"n_in", n_in}, {"n_out", n_out}});
      }
  std::vector<double> values;
  for (double* v : lora.values()) values.push_back(*v);
  spec["lora"] = {{"rank", lora.rank}, {"alpha", lora.alpha}};
  spec["lora_order"] = order;
  spec["lora_values"] = values;
  std::ofstream(spec_path) << spec.dump();

  const nlohmann::json ref =
      nlohmann::json::parse(testing::run_reference_script("lora_grad_ref.py", {spec_path, weights_path}, dir.path));
  const std::vector<double> ref_grad = ref["grad"];
  const std::vector<double*> ours = grads.values();
  REQUIRE(ref_grad.size() == ours.size());
  CHECK(loss == doctest::Approx(ref["loss"].get<double>()).epsilon(1e-10));
  double scale = 0, worst = 0;
  for (double v : ref_grad) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, std::abs(*ours[i] - ref_grad[i]));
  MESSAGE("loss ", loss, " (reference ", ref["loss"].get<double>(), "); ", ours.size(),
          " LoRA gradients, worst |difference| ", worst, " of a largest ", scale);
  CHECK(scale > 0);
  CHECK(worst <= 1e-9 * scale);
}

}  // namespace
}  // namespace choreo
