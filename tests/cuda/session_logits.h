#pragma once
// A session's logits step by step, and how far two runs of them are apart: for comparing the emulated CUDA
// backend with the CPU backend on whole models.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/lora.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"

namespace choreo::testing {

/// The logits of a session on `m`: after `prompt`, then after each of `then` (or, when `then` is empty, after
/// each of `greedy_steps` greedy tokens), with KV pages of 16 tokens in the given cache types, with the
/// adapters of `lora` (null: the base model).
inline std::vector<std::vector<float>> session_logits(
    const model::Model& m, std::span<const model::Token> prompt, std::span<const model::Token> then,
    int greedy_steps = 0, kernels::DType k_type = kernels::DType::F32,
    kernels::DType v_type = kernels::DType::F32, const model::LoraStack* lora = nullptr) {
  kv::PagePool pool(m.backend(), m.kv_layout(16, k_type, v_type), size_t(64) << 20);
  model::Session s(m, pool);
  s.set_lora(lora);
  std::vector<std::vector<float>> out(1);
  s.eval(prompt, &out[0]);
  const size_t n = then.empty() ? size_t(greedy_steps) : then.size();
  for (size_t i = 0; i < n; ++i) {
    const model::Token t = then.empty() ? model::argmax(out.back()) : then[i];
    out.emplace_back();
    s.eval(std::span<const model::Token>(&t, 1), &out.back());
  }
  return out;
}

/// max |a - b| over every step, relative to the step's logit range in b.
inline double worst_relative(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    const auto [lo, hi] = std::minmax_element(b[i].begin(), b[i].end());
    for (size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, double(std::abs(a[i][j] - b[i][j])) / double(*hi - *lo));
  }
  return worst;
}

}  // namespace choreo::testing
