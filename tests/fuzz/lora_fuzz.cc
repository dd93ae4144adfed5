// libFuzzer target for LoRA adapter files (runtime/model/lora.h): any input, read as a GGUF adapter for
// stories260K, must either load or throw InputError, never crash, leak or read out of bounds. An adapter that
// loads then runs a short forward pass on the model, so the checked shapes are the shapes the products use.
// With CHOREO_FUZZ_SEED_DIR set, start-up first writes writer-made adapters for stories260K there
// (scripts/fuzz.sh); the model comes from $CHOREO_SHARED/models/stories260K.gguf.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backend.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/gguf.h"
#include "runtime/model/llama.h"
#include "runtime/model/lora.h"
#include "runtime/model/session.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using namespace choreo;

struct Base {
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  std::unique_ptr<model::Model> model;
};

/// F32 tensor bytes of n small pseudo-random values.
std::vector<uint8_t> values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  std::vector<uint8_t> out(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    const float v = d(rng);
    std::memcpy(&out[i * sizeof(float)], &v, sizeof v);
  }
  return out;
}

/// An adapter for stories260K (dim 64, 8 heads and 4 KV heads of 8, ffn 172, 5 layers, vocab 512) adapting
/// `targets` of `layer`, with rank `rank`.
std::vector<uint8_t> seed_adapter(const std::vector<std::pair<std::string, std::pair<int, int>>>& targets, int rank,
                                  float alpha, unsigned seed) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.type", "adapter");
  w.set_string("adapter.type", "lora");
  w.set_f32("adapter.lora.alpha", alpha);
  for (const auto& [name, shape] : targets) {
    const auto [n_in, n_out] = shape;
    w.add_tensor(name + ".lora_a", {n_in, rank}, kernels::DType::F32, values(size_t(n_in) * rank, seed++));
    w.add_tensor(name + ".lora_b", {rank, n_out}, kernels::DType::F32, values(size_t(rank) * n_out, seed++));
  }
  return w.to_bytes();
}

const Base& base() {
  static const Base loaded = [] {
    Base b;
    const std::string path = (fuzz::shared_dir() / "models" / "stories260K.gguf").string();
    try {
      b.model = model::Model::load(path, *b.backend);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lora_fuzz: cannot load %s: %s (set CHOREO_SHARED)\n", path.c_str(), e.what());
      std::abort();
    }
    if (const char* seeds = std::getenv("CHOREO_FUZZ_SEED_DIR")) {
      const std::pair<int, int> q{64, 64}, kv{64, 32}, o{64, 64}, up{64, 172}, down{172, 64}, out{64, 512};
      const std::vector<std::vector<uint8_t>> files = {
          seed_adapter({{"blk.0.attn_q.weight", q}}, 2, 4.0f, 1),
          seed_adapter({{"blk.1.attn_k.weight", kv}, {"blk.1.attn_v.weight", kv}, {"blk.1.attn_output.weight", o}}, 4,
                       0.0f, 10),
          seed_adapter({{"blk.4.ffn_gate.weight", up}, {"blk.4.ffn_up.weight", up}, {"blk.4.ffn_down.weight", down},
                        {"output.weight", out}},
                       8, 16.0f, 20),
      };
      for (size_t i = 0; i < files.size(); ++i)
        std::ofstream(std::string(seeds) + "/seed_" + std::to_string(i), std::ios::binary)
            .write(reinterpret_cast<const char*>(files[i].data()), std::streamsize(files[i].size()));
    }
    return b;
  }();
  return loaded;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Base& b = base();
  std::shared_ptr<const model::LoraAdapter> adapter;
  try {
    adapter = model::LoraAdapter::load(gguf::File::parse(std::span<const uint8_t>(data, size), "fuzz-input"), *b.model);
  } catch (const InputError&) {
    return 0;
  }
  if (adapter->n_pairs() < 1 || adapter->max_rank() < 1) __builtin_trap();
  // It loaded: it must also run.
  model::LoraStack stack{{{adapter, 0.5f}}};
  kv::PagePool pool(*b.backend, b.model->kv_layout(32), size_t(4) << 20);
  model::Session session(*b.model, pool);
  session.set_lora(&stack);
  std::vector<float> logits;
  const std::vector<model::Token> tokens = {1, 403, 407};
  session.eval(tokens, &logits);
  if (logits.size() != size_t(b.model->config().n_vocab)) __builtin_trap();
  return 0;
}
