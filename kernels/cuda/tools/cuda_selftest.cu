// cuda_selftest: on a machine with an NVIDIA GPU, runs each of choreo's CUDA kernels (kernels/cuda/cuda_kernels.h)
// on random inputs and compares them with choreo's CPU backend or a float64 product, printing one line per
// check (the products, cuBLASLt's and the linear kernel's, are checked by the device tests,
// tests/cuda/device_test.cc, through the backend);
// then measures what the device sustains: HBM traffic of a device-to-device copy and of a read-only kernel, and
// the fp32 peak of its CUDA cores (the arithmetic of choreo's `linear` kernel), for gpu-bundle/run.sh to set
// the benchmarks against. Exit 1 on any mismatch or device error, 2 without a device ("no CUDA device: " and
// why: no NVIDIA driver, one older than the runtime, no GPU). Built whenever nvcc is found (CMake
// CHOREO_CUDA); links no CUDA library but the static runtime, so it starts on a machine without one
// (scripts/gpu_bundle_check.sh).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device/cuda_backend.h"

namespace {

using namespace choreo;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cuda_selftest: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(const std::vector<T>& host) : n(host.size()) {
    check_cuda(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    check_cuda(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  ~Device() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> out(n);
    check_cuda(cudaDeviceSynchronize(), "kernel");
    check_cuda(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return out;
  }
};

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

int failures = 0;

void report(const char* name, const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / std::max(1.0, std::abs(double(want[i]))));
  const bool ok = worst <= tolerance;
  failures += !ok;
  std::printf("%-10s %-4s worst relative difference %.3g (tolerance %.1g)\n", name, ok ? "ok" : "FAIL", worst, tolerance);
}

/// The device, and the fp32 peak of its CUDA cores: SMs x fp32 lanes per SM x 2 (a fused multiply-add) x the
/// peak clock. Lanes per SM: 64 on sm_80 (A100) and before sm_86, 128 from sm_86 on (H100/H200: 128).
void describe_device() {
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int sms = 0, clock_khz = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "multiprocessor count");
  check_cuda(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "clock rate");
  const int cc = prop.major * 10 + prop.minor, lanes = cc < 86 ? 64 : 128;
  const double peak = double(sms) * lanes * 2.0 * clock_khz * 1e3;
  std::printf("device: %s, sm_%d, %d SMs at %.0f MHz, %.1f GiB\n", prop.name, cc, sms, clock_khz / 1e3,
              double(prop.totalGlobalMem) / double(1u << 30));
  std::printf("fp32-peak-tflops: %.1f (%d SMs x %d fp32 lanes x 2 x %.2f GHz: CUDA cores, no tensor cores)\n",
              peak / 1e12, sms, lanes, clock_khz / 1e6);
}

/// Reads every 16-byte word of n words once and writes one sum per block (so the reads are not optimised away).
__global__ void read_words(const uint4* words, size_t n, unsigned* sums) {
  unsigned s = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 w = words[i];
    s ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  atomicXor(&sums[blockIdx.x], s);
}

/// HBM bytes per second the device sustains: a device-to-device copy of 1 GiB (read + write, 20 times) and a
/// kernel reading 2 GiB (10 times); events on one stream time them, after one untimed run of each.
void measure_bandwidth() {
  const size_t copy_bytes = size_t(1) << 30, read_bytes = size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  unsigned* sums = nullptr;
  check_cuda(cudaMalloc(&a, read_bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&b, copy_bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&sums, 4096 * sizeof(unsigned)), "cudaMalloc");
  check_cuda(cudaMemset(a, 1, read_bytes), "cudaMemset");
  check_cuda(cudaMemset(sums, 0, 4096 * sizeof(unsigned)), "cudaMemset");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  const auto timed = [&](int times, auto&& work) {
    work();
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < times; ++i) work();
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "copy");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return double(ms) / 1e3;
  };
  const double copy_s = timed(20, [&] { check_cuda(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice), "copy"); });
  const double read_s = timed(10, [&] {
    read_words<<<4096, 256>>>(static_cast<const uint4*>(a), read_bytes / sizeof(uint4), sums);
    check_cuda(cudaGetLastError(), "read_words");
  });
  std::printf("copy-gbps: %.0f (device-to-device cudaMemcpy of 1 GiB, 20 times: bytes read + written per second)\n",
              2.0 * 20 * double(copy_bytes) / copy_s / 1e9);
  std::printf("read-gbps: %.0f (a kernel reading 2 GiB once, 10 times: bytes read per second)\n",
              10 * double(read_bytes) / read_s / 1e9);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(sums);
  cudaFree(b);
  cudaFree(a);
}

}  // namespace

int main() {
  if (const std::string reason = cuda::no_device_reason(); !reason.empty()) {
    std::fprintf(stderr, "cuda_selftest: no CUDA device: %s\n", reason.c_str());
    return 2;
  }
  describe_device();
  std::unique_ptr<kernels::Backend> cpu = kernels::make_cpu_backend(1);
  const int rows = 7, dim = 576;
  const std::vector<float> x = random_values(size_t(rows) * dim, 1), w = random_values(size_t(dim), 2);
  {
    std::vector<float> want(x.size());
    cpu->rmsnorm(x.data(), w.data(), rows, dim, 1e-5f, want.data());
    Device<float> dx(x), dw(w), dout(want);
    cuda::launch_rmsnorm(dx.p, dw.p, rows, dim, 1e-5f, dout.p, nullptr);
    report("rmsnorm", dout.get(), want, 1e-5);
  }
  {
    std::vector<float> want(x.size());
    cpu->swiglu(x.data(), x.data() + dim, x.size() - dim, want.data());
    Device<float> dx(x), dout(want);
    cuda::launch_swiglu(dx.p, dx.p + dim, x.size() - dim, dout.p, nullptr);
    std::vector<float> got = dout.get();
    got.resize(x.size() - dim);
    want.resize(x.size() - dim);
    report("swiglu", got, want, 1e-6);
  }
  {
    const int heads = 9, head_dim = 64;
    const std::vector<float> q = random_values(size_t(rows) * heads * head_dim, 3);
    std::vector<int32_t> pos(rows);
    for (int r = 0; r < rows; ++r) pos[size_t(r)] = 1000 * r + 3;
    kernels::RopeParams p;
    p.n_dims = head_dim;
    p.freq_base = 100000.0f;
    std::vector<float> want = q;
    cpu->rope(want.data(), rows, heads, head_dim, pos.data(), p);
    Device<float> dq(q);
    Device<int32_t> dpos(pos);
    cuda::launch_rope(dq.p, rows, heads, head_dim, dpos.p, 0, 1, {head_dim, p.freq_base, 1, 0}, nullptr, nullptr);
    report("rope", dq.get(), want, 1e-6);
  }
  {  // LoRA: y += 0.5 · B · (A · x), F32 A (rank x dim) and B (n_out x rank), as the CPU backend's add_lora.
    const int rank = 16, n_out = 96;
    const std::vector<float> a = random_values(size_t(rank) * dim, 6), b = random_values(size_t(n_out) * rank, 7);
    const std::vector<float> y = random_values(size_t(rows) * n_out, 8);
    const auto weight = [](const std::vector<float>& values, int n_rows, int row_length) {
      kernels::Weight w;
      w.data = values.data();
      w.n_out = n_rows;
      w.n_in = row_length;
      w.row_stride = size_t(row_length) * sizeof(float);
      return w;
    };
    std::vector<float> want = y, scratch(size_t(rows) * (rank + n_out));
    cpu->add_lora(cpu->upload_weight(weight(a, rank, dim)), cpu->upload_weight(weight(b, n_out, rank)), 0.5f,
                  x.data(), rows, want.data(), scratch.data());
    Device<float> dx(x), da(a), db(b), dy(y);
    const cuda::kernels::WeightArgs a_args{cuda::kernels::WeightFormat::F32, rank, dim, size_t(dim) * sizeof(float)};
    const cuda::kernels::WeightArgs b_args{cuda::kernels::WeightFormat::F32, n_out, rank, size_t(rank) * sizeof(float)};
    cuda::launch_lora(a_args, da.p, b_args, db.p, 0.5f, dx.p, rows, dy.p, nullptr);
    report("lora", dy.get(), want, 1e-5);
  }
  {  // Page gather (16- and 4-byte words), then scatter into zeroed pages: the pieces the page list says.
    const size_t page_floats = 64;
    const std::vector<float> pool = random_values(10 * page_floats, 5);
    const std::vector<int32_t> pages = {7, 2, 9, 0};
    Device<int32_t> dpages(pages);
    for (const size_t first : {size_t(0), size_t(3)}) {
      const size_t n = page_floats - 2 * first;  // floats [first, first + n) of each page
      std::vector<float> want;
      for (int32_t p : pages) {
        const auto piece = pool.begin() + long(size_t(p) * page_floats + first);
        want.insert(want.end(), piece, piece + long(n));
      }
      Device<float> dpool(pool), dbuffer(want), dback(std::vector<float>(pool.size(), 0.0f));
      cuda::launch_gather_pages(dpool.p, page_floats * 4, dpages.p, int(pages.size()), first * 4, n * 4, dbuffer.p,
                                nullptr);
      report(first == 0 ? "gather16" : "gather4", dbuffer.get(), want, 0.0);
      cuda::launch_scatter_pages(dbuffer.p, dback.p, page_floats * 4, dpages.p, int(pages.size()), first * 4, n * 4,
                                 nullptr);
      std::vector<float> back_want(pool.size(), 0.0f);
      for (size_t i = 0; i < pages.size(); ++i)
        std::copy_n(want.begin() + long(i * n), n, back_want.begin() + long(size_t(pages[i]) * page_floats + first));
      report(first == 0 ? "scatter16" : "scatter4", dback.get(), back_want, 0.0);
    }
  }
  measure_bandwidth();
  std::printf("cuda_selftest: %s\n", failures ? "FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
