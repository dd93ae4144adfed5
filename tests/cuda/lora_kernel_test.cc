// The LoRA kernel (kernels/cuda/kernels/lora.cuh) through the emulated backend's add_lora and launched
// directly in the block emulator (every launch checked for out-of-bounds accesses and shared-memory races):
// - F32, F16 and BF16 adapters (padded rows among them) give a float64 LoRA update of the stored values
//   within f32 rounding, in one launch (the kernel, not the default path);
// - a row's bits are the same alone and anywhere in a batch of 37 rows;
// - more than 65,535 rows (the blocks stride) are all computed, with a one-row launch's bits;
// - quantised adapters and ranks above kLoraMaxRank take the default two products and agree with the CPU
//   backend; the CPU backend's add_lora is the two products, the scale and the add, to the bit;
// - stories260K with a synthetic adapter on every projection of every layer: one lora launch per pair, and
//   the CPU backend's logits.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/emu/block_emulator.h"
#include "kernels/cuda/kernels/lora.cuh"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/model/lora.h"
#include "runtime/model/session.h"
#include "runtime/model/synth_lora.h"
#include "tests/cuda/random_values.h"
#include "tests/cuda/session_logits.h"
#include "tests/cuda/stored_weight.h"
#include "tests/scratch_dir.h"
#include "tests/test_models.h"

namespace choreo {
namespace {

using kernels::DType;
using testing::random_values;
using testing::session_logits;
using testing::StoredWeight;
using testing::worst_relative;

/// An adapter pair in host memory (its values as stored, for references) and on a backend.
struct Pair {
  StoredWeight a, b;
  kernels::Weight a_on, b_on;
  Pair(kernels::Backend& be, DType a_type, DType b_type, int n_in, int rank, int n_out, size_t pad_bytes = 0)
      : a(a_type, rank, n_in, 11, pad_bytes), b(b_type, n_out, rank, 23, pad_bytes) {
    a_on = be.upload_weight(a.w);
    b_on = be.upload_weight(b.w);
  }
};

/// y0 + factor · B · (A · x) for `rows` rows, through the backend's memory.
std::vector<float> lora_update(kernels::Backend& be, const Pair& p, float factor, const std::vector<float>& x,
                               const std::vector<float>& y0, int rows) {
  const kernels::Buffer<float> x_on(be, std::span<const float>(x));
  const kernels::Buffer<float> y_on(be, std::span<const float>(y0));
  const kernels::Buffer<float> scratch(be, size_t(rows) * size_t(p.a.w.n_out + p.b.w.n_out));
  be.add_lora(p.a_on, p.b_on, factor, x_on.data(), rows, y_on.data(), scratch.data());
  std::vector<float> y(y0.size());
  y_on.download(y);
  return y;
}

/// The float64 update y0 + factor · B · (A · x) of the values as stored, for `rows` rows, and its magnitude
/// |y0| + |factor| · Σ_r |B_jr| Σ_k |A_rk x_k|, which rounding errors scale with.
struct Reference {
  std::vector<double> value, magnitude;
};
Reference reference(const StoredWeight& a_stored, const StoredWeight& b_stored, float factor,
                    const std::vector<float>& x, const std::vector<float>& y0, int rows) {
  const int n_in = int(a_stored.w.n_in), rank = int(a_stored.w.n_out), n_out = int(b_stored.w.n_out);
  const std::vector<float> a = a_stored.values(), b = b_stored.values();
  Reference ref{std::vector<double>(size_t(rows) * n_out), std::vector<double>(size_t(rows) * n_out)};
  for (int i = 0; i < rows; ++i) {
    std::vector<double> ranked(size_t(rank), 0.0), size(size_t(rank), 0.0);
    for (int r = 0; r < rank; ++r)
      for (int k = 0; k < n_in; ++k) {
        const double term = double(a[size_t(r) * n_in + k]) * double(x[size_t(i) * n_in + k]);
        ranked[size_t(r)] += term;
        size[size_t(r)] += std::abs(term);
      }
    for (int j = 0; j < n_out; ++j) {
      double update = 0, magnitude = 0;
      for (int r = 0; r < rank; ++r) {
        update += double(b[size_t(j) * rank + r]) * ranked[size_t(r)];
        magnitude += std::abs(double(b[size_t(j) * rank + r])) * size[size_t(r)];
      }
      const size_t at = size_t(i) * n_out + j;
      ref.value[at] = double(y0[at]) + double(factor) * update;
      ref.magnitude[at] = std::abs(double(y0[at])) + std::abs(double(factor)) * magnitude;
    }
  }
  return ref;
}

/// max |y - expected| relative to the reference's magnitude.
double worst_of_magnitude(const std::vector<float>& y, const std::vector<double>& expected,
                          const Reference& ref) {
  REQUIRE(y.size() == expected.size());
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i)
    worst = std::max(worst, std::abs(double(y[i]) - expected[i]) / ref.magnitude[i]);
  return worst;
}

/// The bound of f32 rounding on a LoRA update, relative to its magnitude: a sum of m terms in any fixed order
/// is within m units of rounding (2^-24) of their magnitude, and the update is sums of n_in, then rank terms,
/// scaled and added.
double rounding_bound(int n_in, int rank) { return double(n_in + rank + 2) * std::ldexp(1.0, -24); }

TEST_CASE(
    "cuda backend (emulated): add_lora's kernel is a float64 LoRA update within f32 rounding, for F32, F16 "
    "and BF16 adapters") {
  const std::unique_ptr<kernels::Backend> be = kernels::make_cuda_emulated_backend();
  const int n_in = 70, n_out = 300;  // neither a multiple of a warp; n_out more than the block's 256 threads
  struct Types {
    DType a, b;
  };
  double worst = 0;
  for (const Types types : {Types{DType::F32, DType::F32}, Types{DType::F16, DType::F16},
                            Types{DType::BF16, DType::BF16}, Types{DType::F16, DType::BF16}})
    for (int rank : {1, 8, 33})
      for (int rows : {1, 5})
        for (size_t pad : {size_t(0), size_t(12)}) {
          CAPTURE(int(types.a));
          CAPTURE(int(types.b));
          CAPTURE(rank);
          CAPTURE(rows);
          CAPTURE(pad);
          const Pair p(*be, types.a, types.b, n_in, rank, n_out, pad);
          const std::vector<float> x = random_values(size_t(rows) * n_in, 5, 2.0f);
          const std::vector<float> y0 = random_values(size_t(rows) * n_out, 6);
          const uint64_t launches = cuda::emu::counters().launches;
          const std::vector<float> y = lora_update(*be, p, 0.75f, x, y0, rows);
          // One launch: the lora kernel, not the default path's products, scale and add.
          CHECK(cuda::emu::counters().launches == launches + 1);
          const Reference ref = reference(p.a, p.b, 0.75f, x, y0, rows);
          const double units = worst_of_magnitude(y, ref.value, ref) / rounding_bound(n_in, rank);
          CHECK(units <= 1.0);
          worst = std::max(worst, units);
          CHECK(y != y0);  // not vacuous: the update changed y
        }
  MESSAGE("worst error: " << worst << " of the f32 rounding bound");
}

TEST_CASE(
    "cuda backend (emulated): a row's add_lora bits are the same alone and anywhere in a batch of 37 rows") {
  const std::unique_ptr<kernels::Backend> be = kernels::make_cuda_emulated_backend();
  const int n_in = 45, rank = 33, n_out = 70, batch = 37;
  for (DType type : {DType::F32, DType::F16, DType::BF16}) {
    CAPTURE(int(type));
    const Pair p(*be, type, type, n_in, rank, n_out);
    const std::vector<float> probe = random_values(n_in, 7, 3.0f), probe_y = random_values(n_out, 8);
    const std::vector<float> alone = lora_update(*be, p, 2.0f, probe, probe_y, 1);
    for (int at : {0, 18, batch - 1}) {
      CAPTURE(at);
      std::vector<float> x = random_values(size_t(batch) * n_in, 9, 3.0f),
                         y0 = random_values(size_t(batch) * n_out, 10);
      std::copy(probe.begin(), probe.end(), x.begin() + size_t(at) * n_in);
      std::copy(probe_y.begin(), probe_y.end(), y0.begin() + size_t(at) * n_out);
      const std::vector<float> y = lora_update(*be, p, 2.0f, x, y0, batch);
      CHECK(std::memcmp(y.data() + size_t(at) * n_out, alone.data(), sizeof(float) * n_out) == 0);
    }
  }
}

TEST_CASE(
    "cuda kernels (emulated): lora strides over 70,000 rows, more than a grid's 65,535 blocks, each with its "
    "one-row bits") {
  const int rows = 70000, n_in = 3, rank = 2, n_out = 2;
  REQUIRE(cuda::kernels::lora_blocks(rows) == 65535u);
  const StoredWeight a(DType::F32, rank, n_in, 1), b(DType::F32, n_out, rank, 2);
  const auto weight = [](const StoredWeight& s) {
    const cuda::kernels::WeightArgs args{cuda::kernels::WeightFormat::F32, int(s.w.n_out), int(s.w.n_in),
                                         s.w.row_stride};
    const auto* rows = reinterpret_cast<const float*>(s.bytes.data());
    return cuda::kernels::LoraWeight{args, cuda::cu::make_ptr(rows, s.bytes.size() / sizeof(float)), {}};
  };
  const std::vector<float> x = random_values(size_t(rows) * n_in, 3),
                           y0 = random_values(size_t(rows) * n_out, 4);
  std::vector<float> y = y0;
  // One warp per block, as few fibers as the emulator can run 70,000 rows with; the kernel's sums do not
  // depend on the block size.
  cuda::cu::launch("lora", cuda::kernels::lora, cuda::Dim3(cuda::kernels::lora_blocks(rows)), cuda::Dim3(32),
                   0, nullptr, weight(a), weight(b), 0.5f, cuda::cu::make_ptr(x.data(), x.size()), rows,
                   cuda::cu::make_ptr(y.data(), y.size()));
  const Reference ref = reference(a, b, 0.5f, x, y0, rows);
  CHECK(worst_of_magnitude(y, ref.value, ref) <= rounding_bound(n_in, rank));
  for (int i : {0, 65534, 65535, rows - 1}) {  // the first row, the last of the first pass, the strided ones
    CAPTURE(i);
    std::vector<float> one(y0.begin() + size_t(i) * n_out, y0.begin() + size_t(i + 1) * n_out);
    cuda::cu::launch("lora", cuda::kernels::lora, cuda::Dim3(1), cuda::Dim3(cuda::kernels::kLoraThreads), 0,
                     nullptr, weight(a), weight(b), 0.5f,
                     cuda::cu::make_ptr(x.data() + size_t(i) * n_in, size_t(n_in)), 1,
                     cuda::cu::make_ptr(one.data(), one.size()));
    CHECK(std::memcmp(one.data(), y.data() + size_t(i) * n_out, sizeof(float) * n_out) == 0);
    CHECK(one[0] != y0[size_t(i) * n_out]);  // not vacuous: the row was updated
  }
}

TEST_CASE(
    "cuda backend (emulated): add_lora with a Q8_0 adapter or a rank above kLoraMaxRank takes the default "
    "products, as the CPU backend computes them") {
  const std::unique_ptr<kernels::Backend> gpu = kernels::make_cuda_emulated_backend(),
                                          cpu = kernels::make_cpu_backend(1);
  struct Shape {
    DType a, b;
    int n_in, rank, n_out, rows;
  };
  // Q8_0 blocks hold 32 elements: n_in and the rank are multiples of 32.
  for (const Shape s :
       {Shape{DType::Q8_0, DType::Q8_0, 64, 32, 40, 3}, Shape{DType::Q8_0, DType::F32, 96, 5, 33, 2},
        Shape{DType::F32, DType::F32, 6, cuda::kernels::kLoraMaxRank + 1, 5, 2}}) {
    CAPTURE(int(s.a));
    CAPTURE(s.rank);
    const Pair on_gpu(*gpu, s.a, s.b, s.n_in, s.rank, s.n_out),
        on_cpu(*cpu, s.a, s.b, s.n_in, s.rank, s.n_out);
    const std::vector<float> x = random_values(size_t(s.rows) * s.n_in, 12, 2.0f);
    const std::vector<float> y0 = random_values(size_t(s.rows) * s.n_out, 13);
    const uint64_t launches = cuda::emu::counters().launches;
    const std::vector<float> y_gpu = lora_update(*gpu, on_gpu, 1.5f, x, y0, s.rows);
    CHECK(cuda::emu::counters().launches >= launches + 2);  // at least scale and add beside the products
    const std::vector<float> y_cpu = lora_update(*cpu, on_cpu, 1.5f, x, y0, s.rows);
    const Reference ref = reference(on_gpu.a, on_gpu.b, 1.5f, x, y0, s.rows);
    // The GPU's products keep f32 activations: within rounding. The CPU backend quantises them to 8 bits for
    // Q8_0 weights (as llama.cpp does), so the two agree within that quantisation, not to rounding.
    CHECK(worst_of_magnitude(y_gpu, ref.value, ref) <= rounding_bound(s.n_in, s.rank));
    const double apart = worst_of_magnitude(y_gpu, std::vector<double>(y_cpu.begin(), y_cpu.end()), ref);
    CHECK(apart <= (s.a == DType::F32 ? 2 * rounding_bound(s.n_in, s.rank) : 1e-2));
    MESSAGE("the CPU backend's update is " << apart << " of the magnitude from the emulated backend's");
    CHECK(y_gpu != y0);
  }
}

TEST_CASE("cpu backend: add_lora is the two products, the scale and the add, to the bit") {
  const std::unique_ptr<kernels::Backend> cpu = kernels::make_cpu_backend(2);
  for (DType type : {DType::F32, DType::F16, DType::Q8_0}) {
    CAPTURE(int(type));
    const int n_in = 64, rank = 32, n_out = 48, rows = 7;
    const Pair p(*cpu, type, type, n_in, rank, n_out);
    const std::vector<float> x = random_values(size_t(rows) * n_in, 14),
                             y0 = random_values(size_t(rows) * n_out, 15);
    const std::vector<float> y = lora_update(*cpu, p, 0.3f, x, y0, rows);
    std::vector<float> ranked(size_t(rows) * rank), product(size_t(rows) * n_out), expected = y0;
    cpu->matmul(p.a_on, x.data(), rows, ranked.data());
    cpu->matmul(p.b_on, ranked.data(), rows, product.data());
    cpu->scale(product.data(), product.size(), 0.3f);
    cpu->add(expected.data(), product.data(), product.size());
    CHECK(std::memcmp(y.data(), expected.data(), sizeof(float) * y.size()) == 0);
  }
}

TEST_CASE("add_lora refuses pairs whose shapes do not chain, and negative row counts, on every backend") {
  for (const std::unique_ptr<kernels::Backend>& be :
       {kernels::make_cpu_backend(1), kernels::make_cuda_emulated_backend()}) {
    CAPTURE(be->name());
    const Pair p(*be, DType::F32, DType::F32, 8, 4, 6);
    const StoredWeight wrong(DType::F32, 6, 5, 3);  // rows of 5 values after an A of rank 4
    const kernels::Weight wrong_on = be->upload_weight(wrong.w);
    const kernels::Buffer<float> x(*be, 8), y(*be, 6), scratch(*be, 10);
    CHECK_THROWS_AS(be->add_lora(p.a_on, wrong_on, 1.0f, x.data(), 1, y.data(), scratch.data()),
                    std::invalid_argument);
    CHECK_THROWS_AS(be->add_lora(p.a_on, p.b_on, 1.0f, x.data(), -1, y.data(), scratch.data()),
                    std::invalid_argument);
    CHECK_NOTHROW(be->add_lora(p.a_on, p.b_on, 1.0f, x.data(), 0, y.data(), scratch.data()));
  }
}

/// Launches of one decode step after `prompt` on a session of `m` with `lora` (null: the base model).
uint64_t decode_launches(const model::Model& m, std::span<const model::Token> prompt,
                         const model::LoraStack* lora) {
  kv::PagePool pool(m.backend(), m.kv_layout(16), size_t(16) << 20);
  model::Session s(m, pool);
  s.set_lora(lora);
  s.eval(prompt, nullptr);
  const model::Token token = 1;
  const uint64_t before = cuda::emu::counters().launches;
  s.eval(std::span<const model::Token>(&token, 1), nullptr);
  return cuda::emu::counters().launches - before;
}

TEST_CASE(
    "cuda backend (emulated): stories260K with a LoRA adapter on every projection runs one lora launch per "
    "pair and gives the CPU backend's logits") {
  const model::Model& gpu = *testing::stories260k_cuda_emulated().model;
  const model::Model& cpu = *testing::stories260k().model;
  testing::ScratchDir dir;
  const std::string path = (dir.path / "adapter.gguf").string();
  model::SynthLoraSpec spec;
  spec.strength = 0.2f;
  model::write_synthetic_lora(cpu, spec, path);
  const auto adapter_gpu = model::LoraAdapter::load(path, gpu),
             adapter_cpu = model::LoraAdapter::load(path, cpu);
  const model::LoraStack on_gpu{{{adapter_gpu, 1.0f}}}, on_cpu{{{adapter_cpu, 1.0f}}};
  const std::vector<model::Token> prompt = cpu.vocab().tokenize("Once upon a time", true, true);
  CHECK(decode_launches(gpu, prompt, &on_gpu) ==
        decode_launches(gpu, prompt, nullptr) + uint64_t(adapter_gpu->n_pairs()));
  const auto logits = [&](const model::Model& m, const model::LoraStack* lora) {
    return session_logits(m, prompt, {}, 4, DType::F32, DType::F32, lora);
  };
  const std::vector<std::vector<float>> reference = logits(cpu, &on_cpu);
  const double apart = worst_relative(logits(gpu, &on_gpu), reference);
  MESSAGE("the emulated backend's logits are " << apart << " of the logit range from the CPU backend's");
  // The adapter (strength 0.2) enlarges the activations, and the rounding differences with them: the default
  // path (two products, scale, add) on this backend is 3.0e-6 of the range from the CPU's, the kernel 2.6e-6.
  CHECK(apart <= 5e-6);
  CHECK(worst_relative(logits(gpu, nullptr), reference) > 1e-2);  // not vacuous: the adapter moves the logits
}

}  // namespace
}  // namespace choreo
