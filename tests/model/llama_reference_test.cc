// Differential tests against llama.cpp: same tokens, same greedy continuation, close final logits.

#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "kernels/backend.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "tests/model/lora_fixtures.h"
#include "tests/reference/reference.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

struct Ours {
  std::vector<int32_t> tokens, greedy;
  std::vector<float> logits;
};

Ours run_ours(const model::Model& m, const std::string& prompt, int n_predict, const model::LoraStack* lora = nullptr) {
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(1) << 30);
  model::Session s(m, pool);
  s.set_lora(lora);
  Ours o;
  o.tokens = m.vocab().tokenize(prompt, true, true);
  std::vector<float> logits;
  s.eval(o.tokens, &logits);
  o.logits = logits;
  for (int i = 0; i < n_predict; ++i) {
    model::Token t = model::argmax(logits);
    if (t == m.vocab().eos()) break;
    o.greedy.push_back(t);
    s.eval(std::span<const model::Token>(&t, 1), &logits);
  }
  return o;
}

/// Compares with llama.cpp. Logits: max |Δ| <= rel_tol × (max − min) of llama.cpp's logits. Greedy: ours is
/// teacher-forced along llama.cpp's 32 greedy tokens; at every step llama.cpp's token must be our argmax, or
/// (quantised models only) within `tie_tol` logits of it — 8-bit activation quantisation turns float
/// rounding differences of 1e-7 into logit differences of ~0.5 (measured: tests/model/quantization_noise),
/// so a near-tie may break either way.
/// With `loras`, both engines run with those adapters and scales.
void compare_with_llama_cpp(const std::string& path, const std::vector<std::string>& prompts, double rel_tol,
                            double tie_tol, const std::vector<std::pair<std::string, float>>& loras = {},
                            std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2)) {
  auto m = model::Model::load(path, *backend);
  model::LoraStack stack;
  for (const auto& [file, scale] : loras) stack.adapters.emplace_back(model::LoraAdapter::load(file, *m), scale);
  const model::LoraStack* lora = stack.empty() ? nullptr : &stack;
  std::vector<testing::ReferenceRun> ref = testing::llama_cpp_reference(path, prompts, 32, 0, 0, loras);
  REQUIRE(ref.size() == prompts.size());
  double worst = 0.0;
  int steps = 0, same_argmax = 0, same_sequences = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(prompts[i]);
    Ours ours = run_ours(*m, prompts[i], 32, lora);
    CHECK(ours.tokens == ref[i].tokens);
    same_sequences += ours.greedy == ref[i].greedy;
    REQUIRE(ours.logits.size() == ref[i].logits.size());
    auto [lo, hi] = std::minmax_element(ref[i].logits.begin(), ref[i].logits.end());
    double max_diff = 0.0;
    for (size_t j = 0; j < ours.logits.size(); ++j)
      max_diff = std::max(max_diff, double(std::fabs(ours.logits[j] - ref[i].logits[j])));
    double rel = max_diff / double(*hi - *lo);
    worst = std::max(worst, rel);
    CHECK(rel <= rel_tol);
    // Teacher-forced along llama.cpp's greedy path. When our free-running continuation is llama.cpp's, that
    // path is the one just run: every argmax was llama.cpp's token, and running it again would show nothing.
    if (ours.greedy == ref[i].greedy) {
      steps += int(ref[i].greedy.size());
      same_argmax += int(ref[i].greedy.size());
      continue;
    }
    kv::PagePool pool(m->backend(), m->kv_layout(32), size_t(1) << 30);
    model::Session s(*m, pool);
    s.set_lora(lora);
    std::vector<float> logits;
    s.eval(ours.tokens, &logits);
    for (int32_t t : ref[i].greedy) {
      model::Token mine = model::argmax(logits);
      ++steps;
      same_argmax += mine == t;
      CHECK(logits[mine] - logits[t] <= tie_tol);
      s.eval(std::span<const model::Token>(&t, 1), &logits);
    }
  }
  MESSAGE(path, ": worst max|Δlogit| / logit range = ", worst, " over ", prompts.size(), " prompts; argmax agrees at ",
          same_argmax, "/", steps, " teacher-forced steps; ", same_sequences, "/", prompts.size(),
          " free-running 32-token greedy continuations identical");
  if (tie_tol == 0.0) CHECK(same_sequences == int(prompts.size()));
}

TEST_CASE("stories260K matches llama.cpp: tokens, 32 greedy tokens, final logits") {
  std::vector<std::string> prompts = {
      "Once upon a time", "The little dog", "Lily and Ben went to the park.", "One day, a big bear",
      "Tom had a red ball. He", "The sun was hot and", "Mom said, \"Be careful!\"", "There was a tiny bird",
      "Sue liked to draw.", "In the forest, a fox"};
  compare_with_llama_cpp(testing::shared_file("models/stories260K.gguf"), prompts, 1e-5, 0.0);
}

TEST_CASE("stories260K on the CUDA kernels (block emulator) matches llama.cpp: tokens, 32 greedy tokens, final logits") {
  // The norms, RoPE, attention and KV pages are CUDA kernels run by the emulator; stories260K's F32 products
  // go to the CPU GEMM standing in for cuBLASLt (kernels/cuda/emu/blas_emulated.cc), not to a kernel.
  compare_with_llama_cpp(testing::shared_file("models/stories260K.gguf"),
                         {"Once upon a time", "Lily and Ben went to the park.", "In the forest, a fox"}, 1e-5, 0.0, {},
                         kernels::make_cuda_emulated_backend());
  if (kernels::cuda_device_count() > 0)
    compare_with_llama_cpp(testing::shared_file("models/stories260K.gguf"),
                           {"Once upon a time", "Lily and Ben went to the park.", "In the forest, a fox"}, 1e-5, 0.0, {},
                           kernels::make_backend("cuda", 1, 0));
}

TEST_CASE("SmolLM2-135M-Instruct Q4_1 matches llama.cpp: tokens, final logits, greedy tokens within near-ties") {
  // Each engine's own distance from float-exact activations is ~2% of the logit range on this model (llama.cpp
  // 0.65, choreo 0.79 of a 37-logit range, measured once with a float64-activation matmul); the bound allows the
  // sum of both with margin. Free-running continuations are compared on the F32 weights below: on this file they
  // depend on the exact order of every float operation (llama.cpp's default fp16 KV cache alone changes 7 of its
  // own 11 continuations; tests/reference/llama_self_consistency.py).
  compare_with_llama_cpp(testing::require_file(testing::default_model()), testing::smollm2_prompts(), 0.08, 0.75);
}

TEST_CASE("SmolLM2-135M-Instruct with F32 weights matches llama.cpp: tokens, 32 greedy tokens, final logits") {
  // The same model with the Q4_1 file's weights converted to F32 by llama.cpp's quantize tool: the values both
  // engines dequantise to, without 8-bit activation quantisation. Every continuation must be identical.
  const std::string& f32 = testing::smollm2_f32_path();
  compare_with_llama_cpp(f32, testing::smollm2_prompts(), 1e-5, 0.0);
}

/// The adapters' tests take the first five prompts: an adapter changes the arithmetic of every token alike, and
/// the eleven cost a minute per test on 2 cores.
std::vector<std::string> lora_prompts() {
  std::vector<std::string> prompts = testing::smollm2_prompts();
  prompts.resize(std::min<size_t>(prompts.size(), 5));
  return prompts;
}

TEST_CASE("SmolLM2-135M-Instruct F32 with the math LoRA adapter matches llama.cpp: 32 greedy tokens, final logits") {
  // llama.cpp applies the same adapter file (llama_adapter_lora_init + llama_set_adapters_lora) unmerged.
  const std::string& f32 = testing::smollm2_f32_path();
  compare_with_llama_cpp(f32, lora_prompts(), 1e-5, 0.0, {{testing::math_lora(), 1.0f}});
}

TEST_CASE("SmolLM2-135M-Instruct F32 with two LoRA adapters stacked matches llama.cpp") {
  const std::string& f32 = testing::smollm2_f32_path();
  testing::ScratchDir dir;
  const std::string shifted = (dir.path / "shifted.gguf").string();
  testing::write_shifted_math_lora(shifted);
  compare_with_llama_cpp(f32, lora_prompts(), 1e-5, 0.0, {{testing::math_lora(), 0.7f}, {shifted, -0.4f}});
}

TEST_CASE("stories260K greedy continuation is the one given in shared/README.md") {
  auto backend = kernels::make_cpu_backend(2);
  auto m = model::Model::load(testing::shared_file("models/stories260K.gguf"), *backend);
  Ours o = run_ours(*m, "Once upon a time", 32);
  CHECK(o.tokens == std::vector<int32_t>{1, 403, 407, 261, 378});
  std::string text = m->vocab().detokenize(o.greedy);
  CHECK(text == ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw");
}

}  // namespace
}  // namespace choreo
