// Times the CPU matrix products on the weight shapes of SmolLM2-135M and Llama-3.2-1B, for decode (one
// activation row) and prefill (512 rows), for every weight type, against OpenBLAS cblas_sgemm on the same
// weights dequantised to fp32, measured in the same run with the same thread count.
//
// Decode streams a whole model's worth of distinct weight memory per token (enough distinct layer copies to
// exceed the caches, kCacheBytes), so GB/s is DRAM bandwidth; prefill times one layer (compute-bound) and scales by the
// layer count. The implied tokens/s count only the matrix products (the output matrix for one row, as
// llama.cpp computes logits of the last prompt token only).
//
// Quantised types are measured twice: read in place from GGUF rows, and packed as the CPU backend packs them at
// load ("packed", AVX-512 only; kernels/cpu/matmul.h pack_weight).
//
// Usage: bench_matmul [threads=2] [model filter: smol|1b] [type filter: e.g. Q4_1]
//        bench_matmul [threads=2] stream     the machine's memory bandwidth (STREAM-like), see stream()

// GCC 12's AVX-512 headers build _mm512_undefined_*() from a self-initialised variable, which -Wuninitialized
// reports at every inlined use (as in kernels/cpu/matmul_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

namespace {

using choreo::kernels::DType;
using choreo::kernels::Weight;

struct MatrixShape {
  const char* name;
  int64_t n_out, n_in;
};

struct ModelShape {
  const char* name;
  int n_layers;
  std::vector<MatrixShape> layer;
  MatrixShape output;
};

const std::vector<ModelShape>& models() {
  static const std::vector<ModelShape> all = {
      {"SmolLM2-135M",
       30,
       {{"q", 576, 576},
        {"k", 192, 576},
        {"v", 192, 576},
        {"o", 576, 576},
        {"gate", 1536, 576},
        {"up", 1536, 576},
        {"down", 576, 1536}},
       {"output", 49152, 576}},
      {"Llama-3.2-1B",
       16,
       {{"q", 2048, 2048},
        {"k", 512, 2048},
        {"v", 512, 2048},
        {"o", 2048, 2048},
        {"gate", 8192, 2048},
        {"up", 8192, 2048},
        {"down", 2048, 8192}},
       {"output", 128256, 2048}},
  };
  return all;
}

// A fast deterministic generator: weights only need to be non-degenerate.
struct Random {
  uint64_t state;
  float next() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t(1) << 23)) * 0x1p-23f;
  }
};

/// One encoded matrix, held in memory the way a loaded model holds it.
struct Matrix {
  std::vector<uint8_t> bytes;
  Weight weight;
};

Matrix encode(DType type, const MatrixShape& shape, uint64_t seed) {
  Matrix m;
  const size_t stride = choreo::kernels::row_bytes(type, shape.n_in);
  m.bytes.resize(stride * shape.n_out);
  Random random{seed * 0x9e3779b97f4a7c15ull + 1};
  std::vector<float> row(shape.n_in);
  for (int64_t r = 0; r < shape.n_out; ++r) {
    for (auto& v : row) v = random.next() * 0.05f;
    choreo::kernels::quantize_row(type, row.data(), m.bytes.data() + r * stride, shape.n_in);
  }
  m.weight = {type, m.bytes.data(), shape.n_out, shape.n_in, stride};
  return m;
}

/// The same matrix dequantised to fp32, row-major [n_out][n_in], for the BLAS baseline.
std::vector<float> dequantised(const Matrix& m) {
  std::vector<float> out(m.weight.n_out * m.weight.n_in);
  for (int64_t r = 0; r < m.weight.n_out; ++r) {
    choreo::kernels::dequantize_row(m.weight.type, m.bytes.data() + r * m.weight.row_stride,
                                    out.data() + r * m.weight.n_in, m.weight.n_in);
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Best time of `run` over repetitions lasting at least `budget_seconds` in total (and at least 2 runs).
template <typename Run>
double best_time(Run run, double budget_seconds) {
  run();  // warm-up: scratch buffers, page faults
  double best = 1e30, total = 0;
  for (int i = 0; total < budget_seconds || i < 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double t = seconds_since(start);
    best = std::min(best, t);
    total += t;
  }
  return best;
}

/// Per-token (decode) or per-prefill time of all matrix products of a model, in seconds.
struct Timing {
  double decode_seconds = 0;   // one token: n_layers layers + output, n = 1
  double prefill_seconds = 0;  // 512 tokens: n_layers layers at n = 512 + output at n = 1
  double decode_bytes = 0;     // weight bytes read per decoded token
};

constexpr int kPrefillRows = 512;
// Distinct memory swept per decode measurement: more than twice this project's machine's 260 MiB L3, so
// that decode reads come from DRAM, as a real model's do.
constexpr double kCacheBytes = 640.0 * 1024 * 1024;

/// Times the matrix products of one model given a way to multiply one matrix.
/// `layers` holds `copies` distinct copies of a layer; `multiply(matrix index, copy, n)`.
template <typename Multiply>
Timing time_model(const ModelShape& model, int copies, double layer_bytes, double output_bytes,
                  Multiply multiply) {
  const int n_matrices = static_cast<int>(model.layer.size());
  const int output_index = n_matrices;
  Timing t;
  const double sweep = best_time(
      [&] {
        for (int c = 0; c < copies; ++c) {
          for (int m = 0; m < n_matrices; ++m) multiply(m, c, 1);
        }
      },
      0.4);
  const double output_decode = best_time([&] { multiply(output_index, 0, 1); }, 0.2);
  t.decode_seconds = sweep / copies * model.n_layers + output_decode;
  t.decode_bytes = layer_bytes * model.n_layers + output_bytes;
  const double layer_prefill = best_time(
      [&] {
        for (int m = 0; m < n_matrices; ++m) multiply(m, 0, kPrefillRows);
      },
      0.5);
  t.prefill_seconds = layer_prefill * model.n_layers + output_decode;
  return t;
}

double model_flops(const ModelShape& model, int n_rows_layers) {
  double per_layer = 0;
  for (const auto& m : model.layer) per_layer += 2.0 * m.n_out * m.n_in;
  return per_layer * model.n_layers * n_rows_layers + 2.0 * model.output.n_out * model.output.n_in;
}

void print_row(const ModelShape& model, const char* what, const Timing& t, const Timing* baseline) {
  const double decode_gflops = model_flops(model, 1) / t.decode_seconds * 1e-9;
  const double prefill_gflops = model_flops(model, kPrefillRows) / t.prefill_seconds * 1e-9;
  std::printf("%-13s %-11s | decode %8.2f ms %7.1f tok/s %6.1f GB/s %6.1f GFLOP/s", model.name, what,
              t.decode_seconds * 1e3, 1.0 / t.decode_seconds, t.decode_bytes / t.decode_seconds * 1e-9,
              decode_gflops);
  if (baseline) std::printf(" x%5.2f", baseline->decode_seconds / t.decode_seconds);
  std::printf(" | prefill %8.1f ms %7.1f tok/s %6.1f GFLOP/s", t.prefill_seconds * 1e3,
              kPrefillRows / t.prefill_seconds, prefill_gflops);
  if (baseline) std::printf(" x%5.2f", baseline->prefill_seconds / t.prefill_seconds);
  std::printf("\n");
  std::fflush(stdout);
}

int copies_for(double layer_bytes, int n_layers) {
  return std::clamp(static_cast<int>(kCacheBytes / layer_bytes) + 1, 1, n_layers);
}

}  // namespace

/// Sums kPiece floats with 64-byte loads and four independent sums: one load per cache line, so the loop is
/// bound by memory, not by instructions (the portable loop below reads ~30% slower on this project's machine).
__attribute__((target("avx512f"))) double sum_avx512(const float* v, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(v + i));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(v + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_loadu_ps(v + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_loadu_ps(v + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

double sum_portable(const float* v, size_t n) {
  float s[16] = {};
  for (size_t i = 0; i < n; i += 16)
    for (int j = 0; j < 16; ++j) s[j] += v[i + j];
  double total = 0;
  for (float x : s) total += x;
  return total;
}

/// The machine's memory bandwidth with `threads` threads of the kernel pool, STREAM-like: buffers of 512 MiB
/// (far past any cache), best of 7 passes after a warm-up. "read" sums one buffer (what a decode does to the
/// weights; bytes read), with AVX-512 when the CPU has it, "copy" copies one into another (STREAM's Copy:
/// bytes read plus bytes written).
int stream(int threads) {
  constexpr size_t kFloats = size_t(128) << 20;  // 512 MiB
  std::vector<float> a(kFloats, 1.0f), b(kFloats, 0.0f);
  choreo::kernels::cpu::ThreadPool& pool = choreo::kernels::cpu::kernel_pool();
  constexpr int64_t kPieces = 1024;
  constexpr size_t kPiece = kFloats / kPieces;
  std::vector<double> partial(kPieces);
  const bool avx512 = choreo::kernels::cpu::simd_level() == choreo::kernels::cpu::SimdLevel::Avx512;
  const auto best_seconds = [&](auto&& pass) {
    double best = 1e30;
    for (int rep = 0; rep < 8; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      pass();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::min(best, s);
    }
    return best;
  };
  const double read_s = best_seconds([&] {
    pool.parallel_for(kPieces, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const float* v = a.data() + size_t(p) * kPiece;
        partial[size_t(p)] = avx512 ? sum_avx512(v, kPiece) : sum_portable(v, kPiece);
      }
    });
  });
  const double copy_s = best_seconds([&] {
    pool.parallel_for(kPieces, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        std::memcpy(b.data() + size_t(p) * kPiece, a.data() + size_t(p) * kPiece, kPiece * sizeof(float));
    });
  });
  double check = 0;
  for (double x : partial) check += x;
  if (check != double(kFloats) || b[kFloats - 1] != 1.0f) {
    std::fprintf(stderr, "stream: wrong results\n");
    return 1;
  }
  const double bytes = double(kFloats) * sizeof(float);
  std::printf("threads %d: read %.1f GB/s, copy %.1f GB/s (STREAM Copy convention: read + written)\n", threads,
              bytes / read_s / 1e9, 2 * bytes / copy_s / 1e9);
  return 0;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string model_filter = argc > 2 ? argv[2] : "";
  if (model_filter == "stream") {
    choreo::kernels::cpu::kernel_pool().set_threads(threads);
    return stream(threads);
  }
  const std::string type_filter = argc > 3 ? argv[3] : "";
  choreo::kernels::cpu::kernel_pool().set_threads(threads);
  openblas_set_num_threads(threads);
  std::printf("threads %d, SIMD level %s; ratios xN = OpenBLAS sgemm time / our time (higher is better)\n",
              threads,
              std::string(choreo::kernels::cpu::simd_level_name(choreo::kernels::cpu::simd_level())).c_str());

  std::vector<float> x(kPrefillRows * 8192), y(kPrefillRows * 128256);
  Random random{42};
  for (auto& v : x) v = random.next();

  // OpenBLAS's worker threads keep spinning after a call and would starve ours, so every measurement of
  // our kernels runs first and the baselines last.
  struct Result {
    const ModelShape* model;
    std::string what;
    Timing timing;
  };
  std::vector<Result> results;
  std::vector<const ModelShape*> selected;
  for (const ModelShape& model : models()) {
    const std::string name = model.name;
    if (model_filter.empty() || name.find(model_filter) != std::string::npos ||
        (model_filter == "smol" && name[0] == 'S') || (model_filter == "1b" && name[0] == 'L')) {
      selected.push_back(&model);
    }
  }
  for (const ModelShape* model : selected) {
    std::vector<MatrixShape> shapes = model->layer;
    shapes.push_back(model->output);
    for (DType type : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::F16, DType::BF16, DType::F32}) {
      const char* type_name = choreo::kernels::type_traits(type).name.data();
      if (!type_filter.empty() && type_filter != type_name) continue;
      double layer_bytes = 0;
      for (const auto& s : model->layer) layer_bytes += choreo::kernels::row_bytes(type, s.n_in) * s.n_out;
      const int copies = copies_for(layer_bytes, model->n_layers);
      std::vector<std::vector<Matrix>> weights(copies);
      for (int c = 0; c < copies; ++c) {
        for (size_t m = 0; m < shapes.size(); ++m) {
          if (c > 0 && m == model->layer.size()) break;  // one output matrix
          if (c == 0) {
            weights[c].push_back(encode(type, shapes[m], m + 1));
          } else {  // the same values in distinct memory: encoding is slow, copying is not
            weights[c].push_back(weights[0][m]);
            weights[c].back().weight.data = weights[c].back().bytes.data();
          }
        }
      }
      const double output_bytes = choreo::kernels::row_bytes(type, model->output.n_in) * model->output.n_out;
      const Timing ours = time_model(*model, copies, layer_bytes, output_bytes, [&](int m, int c, int n) {
        choreo::kernels::cpu::matmul(weights[c][m].weight, x.data(), n, y.data());
      });
      results.push_back({model, type_name, ours});
      std::fprintf(stderr, "measured %s %s\n", model->name, type_name);
      // The same weights packed as the CPU backend packs them at load (AVX-512 only).
      bool packed = false;
      for (auto& copy : weights) {
        for (Matrix& m : copy) {
          m.weight.packed = choreo::kernels::cpu::pack_weight(m.weight);
          packed = m.weight.packed != nullptr;
        }
      }
      if (!packed) continue;
      const Timing ours_packed = time_model(*model, copies, layer_bytes, output_bytes, [&](int m, int c, int n) {
        choreo::kernels::cpu::matmul(weights[c][m].weight, x.data(), n, y.data());
      });
      results.push_back({model, std::string(type_name) + " packed", ours_packed});
      std::fprintf(stderr, "measured %s %s packed\n", model->name, type_name);
    }
  }
  for (const ModelShape* model : selected) {
    // The baseline: sgemm on fp32 weights (dequantised Q8_0, so values are those of a real quantised model).
    std::vector<MatrixShape> shapes = model->layer;
    shapes.push_back(model->output);
    double layer_bytes = 0;
    for (const auto& s : model->layer) layer_bytes += 4.0 * s.n_out * s.n_in;
    const int copies = copies_for(layer_bytes, model->n_layers);
    std::vector<std::vector<std::vector<float>>> weights(copies);
    for (int c = 0; c < copies; ++c) {
      for (size_t m = 0; m < shapes.size(); ++m) {
        if (c > 0 && m == model->layer.size()) break;
        weights[c].push_back(c == 0 ? dequantised(encode(DType::Q8_0, shapes[m], m + 1)) : weights[0][m]);
      }
    }
    const Timing blas =
        time_model(*model, copies, layer_bytes, 4.0 * model->output.n_out * model->output.n_in,
                   [&](int m, int c, int n) {
                     const MatrixShape& s = shapes[m];
                     cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(s.n_out),
                                 static_cast<int>(s.n_in), 1.0f, x.data(), static_cast<int>(s.n_in),
                                 weights[c][m].data(), static_cast<int>(s.n_in), 0.0f, y.data(),
                                 static_cast<int>(s.n_out));
                   });
    print_row(*model, "sgemm-f32", blas, nullptr);
    for (const Result& r : results) {
      if (r.model == model) print_row(*model, r.what.c_str(), r.timing, &blas);
    }
  }
  return 0;
}
