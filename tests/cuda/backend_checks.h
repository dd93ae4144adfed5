#pragma once
// Checks of the CUDA backend as a whole, written once and run on the emulated backend (tests/cuda/backend_test.cc)
// and on a CUDA device (tests/cuda/device_test.cc, gpu-bundle/run.sh):
// - the matrix products (cuBLAS's GEMM conventions for F32, F16 and BF16 weights: cuBLASLt on a GPU, a CPU GEMM
//   in emulation; the linear kernel for the quantised formats) against a float64 product of the dequantised
//   weight, and a row's bits the same alone and in batches of any size;
// - stories260K: the greedy continuation shared/README.md gives (llama.cpp's and llama2.c's), and final logits
//   within float rounding of the CPU backend's;
// - the head shapes of every shipped model shape against the CPU backend's logits.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/quant.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"
#include "runtime/model/synth.h"
#include "tests/cuda/random_values.h"
#include "tests/cuda/session_logits.h"
#include "tests/cuda/stored_weight.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo::testing {

/// w · x for `rows` rows of host values, through the backend's memory.
inline std::vector<float> product(kernels::Backend& be, const kernels::Weight& w, const float* x, int rows) {
  const kernels::Buffer<float> x_on(be, std::span(x, size_t(rows) * size_t(w.n_in)));
  const kernels::Buffer<float> y_on(be, size_t(rows) * size_t(w.n_out));
  be.matmul(w, x_on.data(), rows, y_on.data());
  std::vector<float> y(y_on.size());
  y_on.download(y);
  return y;
}

/// w · x for n_out × n_in weights in every format the backend reads, against float64 and across batches: five
/// rows, each alone, in batches of 6, 37 and 150 rows, and (many_rows > 0) in a batch of that many, row 3 at
/// 0, 255, 256 and the end; embedding rows of each weight equal its stored rows.
inline void check_products(kernels::Backend& be, int n_in, int n_out, int many_rows = 0) {
  using kernels::DType;
  const int n = 5;
  const std::vector<float> x = random_values(size_t(n) * n_in, 5, 2.0f);
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    CAPTURE(int(type));
    const StoredWeight sw(type, n_out, n_in, 17);
    const kernels::Weight w = be.upload_weight(sw.w);
    const std::vector<float> y = product(be, w, x.data(), n);
    // Against float64 over the weight as stored (dequantised by kernels/quant.cc). F32, F16 and BF16 weights go
    // to cuBLAS (in emulation a GEMM summing over k in order), whose operands share the weight's type: the
    // activations are rounded to it first (kernels/quant.cc's rounding), and a sum of n_in terms in order is
    // within n_in units of rounding (2^-24) of their magnitude. The linear kernel of the quantised formats keeps
    // f32 activations and sums in lanes (bound below).
    const bool gemm = type == DType::F32 || type == DType::F16 || type == DType::BF16;
    std::vector<float> operand = x;
    if (type != DType::F32 && gemm)
      for (float& v : operand) {
        std::vector<uint8_t> narrow(kernels::row_bytes(type, 1));
        kernels::quantize_row(type, &v, narrow.data(), 1);
        kernels::dequantize_row(type, narrow.data(), &v, 1);
      }
    std::vector<float> row(n_in);
    double worst = 0;
    for (int o = 0; o < n_out; ++o) {
      kernels::dequantize_row(type, sw.bytes.data() + size_t(o) * sw.w.row_stride, row.data(), n_in);
      for (int r = 0; r < n; ++r) {
        double want = 0, magnitude = 0;
        for (int k = 0; k < n_in; ++k) {
          want += double(row[size_t(k)]) * double(operand[size_t(r) * n_in + k]);
          magnitude += std::abs(double(row[size_t(k)]) * double(operand[size_t(r) * n_in + k]));
        }
        worst = std::max(worst, std::abs(double(y[size_t(r) * n_out + o]) - want) / magnitude);
      }
    }
    // The linear kernel: each lane sums n_in / 32 products in order, then five levels of a shuffle tree.
    CHECK(worst < (gemm ? n_in * 0x1p-24 : std::max(1e-6, (n_in / 32 + 6) * 0x1p-24)));
    // Each row alone, and the rows in another batch (reversed, with a copy of row 2): the same bits.
    for (int r = 0; r < n; ++r) {
      const std::vector<float> alone = product(be, w, x.data() + size_t(r) * n_in, 1);
      CHECK(std::memcmp(alone.data(), y.data() + size_t(r) * n_out, sizeof(float) * n_out) == 0);
    }
    std::vector<float> other;
    for (int r : {4, 2, 3, 2, 1, 0}) other.insert(other.end(), x.begin() + long(r) * n_in, x.begin() + long(r + 1) * n_in);
    const std::vector<float> y2 = product(be, w, other.data(), 6);
    CHECK(std::memcmp(y2.data() + n_out, y.data() + 2 * n_out, sizeof(float) * n_out) == 0);
    CHECK(std::memcmp(y2.data() + 5 * n_out, y.data(), sizeof(float) * n_out) == 0);
    // A batch of 37 rows (three of the kernel's 16-row groups) holding row 3 at 0, 20 and 36.
    std::vector<float> big = random_values(37 * size_t(n_in), 6, 2.0f);
    for (int at : {0, 20, 36}) std::copy_n(x.begin() + 3 * n_in, n_in, big.begin() + long(at) * n_in);
    const std::vector<float> y3 = product(be, w, big.data(), 37);
    for (int at : {0, 20, 36})
      CHECK(std::memcmp(y3.data() + long(at) * n_out, y.data() + 3 * n_out, sizeof(float) * n_out) == 0);
    // 150 rows (ten of the kernel's 16-row groups, the last one partial), row 3 at either end of several.
    std::vector<float> many = random_values(150 * size_t(n_in), 7, 2.0f);
    for (int at : {0, 63, 64, 127, 128, 149}) std::copy_n(x.begin() + 3 * n_in, n_in, many.begin() + long(at) * n_in);
    const std::vector<float> y4 = product(be, w, many.data(), 150);
    for (int at : {0, 63, 64, 127, 128, 149})
      CHECK(std::memcmp(y4.data() + long(at) * n_out, y.data() + 3 * n_out, sizeof(float) * n_out) == 0);
    // Optionally more rows than the 256 at which cuBLASLt's algorithm is pinned (kernels/cuda/device/gemm_lt.cu).
    if (many_rows > 0) {
      std::vector<float> more = random_values(size_t(many_rows) * size_t(n_in), 8, 2.0f);
      const std::vector<int> at_rows = {0, 255, 256, many_rows - 1};
      for (int at : at_rows) std::copy_n(x.begin() + 3 * n_in, n_in, more.begin() + long(at) * n_in);
      const std::vector<float> y5 = product(be, w, more.data(), many_rows);
      for (int at : at_rows)
        CHECK(std::memcmp(y5.data() + long(at) * n_out, y.data() + 3 * n_out, sizeof(float) * n_out) == 0);
    }
    // Embedding rows: the stored rows, dequantised.
    const std::vector<int32_t> ids = {3, 36, 0, 3};
    const kernels::Buffer<float> embedded_on(be, ids.size() * size_t(n_in));
    be.embed(w, ids, embedded_on.data());
    std::vector<float> embedded(embedded_on.size());
    embedded_on.download(embedded);
    for (size_t i = 0; i < ids.size(); ++i) {
      kernels::dequantize_row(type, sw.bytes.data() + size_t(ids[i]) * sw.w.row_stride, row.data(), n_in);
      CHECK(std::memcmp(row.data(), embedded.data() + i * size_t(n_in), sizeof(float) * size_t(n_in)) == 0);
    }
  }
}

/// The F32, F16 and BF16 products of `be` (cuBLASLt on a GPU, the emulated GEMM otherwise) against the CPU
/// backend's, for `rows` rows of n_in: each differs from the float64 product of what it multiplies by at most
/// n_in units of f32 rounding of its magnitude (check_products), and `be` rounds the activations to the
/// weight's type first where the CPU backend keeps them in f32, so the two differ by at most that rounding
/// (half a unit of the type: 2^-11 for f16, 2^-8 for bf16, none for f32) plus both sums' rounding, all
/// relative to sum |w x|.
inline void check_products_against_cpu(kernels::Backend& be, int n_in, int n_out, int rows) {
  using kernels::DType;
  const std::vector<float> x = random_values(size_t(rows) * n_in, 9, 2.0f);
  for (const auto& [type, activation_rounding] :
       {std::pair{DType::F32, 0.0}, std::pair{DType::F16, 0x1p-11}, std::pair{DType::BF16, 0x1p-8}}) {
    CAPTURE(int(type));
    const StoredWeight sw(type, n_out, n_in, 23);
    const std::vector<float> on_be = product(be, be.upload_weight(sw.w), x.data(), rows);
    kernels::Backend& cpu = cpu_backend();
    const std::vector<float> on_cpu = product(cpu, cpu.upload_weight(sw.w), x.data(), rows);
    const std::vector<float> w = sw.values();
    double worst = 0;  // |be - cpu| / sum |w x|, the largest over the outputs
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < n_out; ++o) {
        double magnitude = 0;
        for (int k = 0; k < n_in; ++k)
          magnitude += std::abs(double(w[size_t(o) * n_in + k]) * double(x[size_t(r) * n_in + k]));
        const size_t at = size_t(r) * n_out + o;
        worst = std::max(worst, std::abs(double(on_be[at]) - double(on_cpu[at])) / magnitude);
      }
    MESSAGE("type ", int(type), ": max |product - CPU backend's| / sum |w x| = ", worst);
    CHECK(worst <= activation_rounding + 2 * n_in * 0x1p-24);
    if (type != DType::F32) CHECK(worst > 0);  // not vacuous: the activations were rounded
  }
}

/// A backend to load a model on (the emulated one, or a device's).
using BackendMaker = std::function<std::unique_ptr<kernels::Backend>()>;

/// A random-weight F32 model of `shape`, on a backend `make` makes and on the CPU backend (its file removed once
/// both have mapped it).
struct OnBothBackends {
  LoadedModel gpu, cpu;
};
inline OnBothBackends synthetic_on_both(const model::SynthShape& shape, uint64_t seed, const BackendMaker& make) {
  ScratchDir dir;
  const std::string path = (dir.path / "synthetic.gguf").string();
  model::write_synthetic_model(shape, kernels::DType::F32, path, seed);
  return {LoadedModel(path, make()), LoadedModel(path)};
}

/// The head shapes of every shipped model shape on a backend `make` makes give the CPU backend's logits.
inline void check_shipped_heads(const BackendMaker& make, const std::string& label) {
  // Each built-in shape of `choreo model synth` (SmolLM2-135M/360M, TinyLlama, Llama-3.2-1B/3B, Llama-3.1-8B)
  // with its head dimension (64 or 128), its query heads per KV head (3 to 8), its RoPE (Llama-3 frequency
  // factors) and BOS, but two KV heads, two layers, a feed-forward of 256 and a vocabulary of 512, so that the
  // emulation stays fast. Random F32 weights; a 30-token prompt and three decode steps.
  for (const std::string& name : model::synth_shape_names()) {
    CAPTURE(name);
    model::SynthShape shape = *model::find_synth_shape(name);
    const int64_t head_dim = shape.head_dim(), ratio = shape.head_count / shape.head_count_kv;
    shape.head_count_kv = 2;
    shape.head_count = 2 * ratio;
    shape.embedding_length = shape.head_count * head_dim;
    shape.block_count = 2;
    shape.feed_forward_length = 256;
    shape.vocab_size = 512;
    const auto [gpu, cpu] = synthetic_on_both(shape, 9, make);
    REQUIRE(gpu.model->config().head_dim == int(head_dim));
    std::vector<model::Token> prompt;
    for (int i = 0; i < 30; ++i) prompt.push_back((i * 53 + 7) % 512);
    const std::vector<model::Token> then = {3, 100, 511};
    const double worst = worst_relative(session_logits(*gpu.model, prompt, then), session_logits(*cpu.model, prompt, then));
    MESSAGE(label, ", ", name, " heads (", head_dim, " dims, ", ratio, " query heads per KV head): max |Δlogit| / range = ",
            worst);
    CHECK(worst < 1e-5);
  }
}

/// stories260K on `gpu` continues as shared/README.md says, and its first logits are the CPU backend's within
/// float rounding.
inline void check_stories260k(const model::Model& gpu, const std::string& label) {
  const model::Model& cpu = *stories260k().model;
  std::vector<float> logits_gpu, logits_cpu;
  std::vector<model::Token> greedy;
  {
    kv::PagePool pool(gpu.backend(), gpu.kv_layout(32), size_t(64) << 20);
    model::Session s(gpu, pool);
    s.eval(gpu.vocab().tokenize("Once upon a time", true, true), &logits_gpu);
    std::vector<float> logits = logits_gpu;
    for (int i = 0; i < 32; ++i) {
      const model::Token t = model::argmax(logits);
      greedy.push_back(t);
      s.eval(std::span<const model::Token>(&t, 1), &logits);
    }
  }
  CHECK(gpu.vocab().detokenize(greedy) ==
        ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw");
  kv::PagePool pool(cpu.backend(), cpu.kv_layout(32), size_t(64) << 20);
  model::Session s(cpu, pool);
  s.eval(cpu.vocab().tokenize("Once upon a time", true, true), &logits_cpu);
  REQUIRE(logits_cpu.size() == logits_gpu.size());
  const auto [lo, hi] = std::minmax_element(logits_cpu.begin(), logits_cpu.end());
  double worst = 0;
  for (size_t i = 0; i < logits_cpu.size(); ++i) worst = std::max(worst, double(std::abs(logits_cpu[i] - logits_gpu[i])));
  MESSAGE("stories260K, ", label, " vs CPU backend: max |Δlogit| / range = ", worst / double(*hi - *lo));
  CHECK(worst / double(*hi - *lo) < 1e-5);
}

}  // namespace choreo::testing
