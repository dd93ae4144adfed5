// cuda_selftest: on a machine with an NVIDIA GPU, runs each of choreo's CUDA kernels (kernels/cuda/cuda_kernels.h)
// and one cuBLAS SGEMM on random inputs and compares them with choreo's CPU backend, printing one line per
// check; exit 1 on any mismatch or device error, 2 without a device. Built whenever nvcc is found (CMake
// CHOREO_CUDA); it has never run on a GPU (none was available): scripts/gpu_check.sh is where it will.

#include <cublas_v2.h>
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

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "cuda_selftest: no CUDA device\n");
    return 2;
  }
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
  {  // cuBLAS: y = x W^T, W n_out x dim, as the CPU backend's matmul.
    const int n_out = 96;
    const std::vector<float> wt = random_values(size_t(n_out) * dim, 4);
    std::vector<float> want(size_t(rows) * n_out, 0.0f);
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < n_out; ++o) {
        double s = 0;
        for (int k = 0; k < dim; ++k) s += double(x[size_t(r) * dim + k]) * wt[size_t(o) * dim + k];
        want[size_t(r) * n_out + o] = float(s);
      }
    Device<float> dx(x), dw(wt), dy(want);
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cuda_selftest: cublasCreate failed\n");
      return 1;
    }
    const float one = 1.0f, zero = 0.0f;
    // Column-major view: Y^T (n_out x rows) = W (n_out x dim, stored as W^T row-major) * X^T (dim x rows).
    const cublasStatus_t s = cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, n_out, rows, dim, &one, dw.p, dim, dx.p,
                                         dim, &zero, dy.p, n_out);
    cublasDestroy(handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cuda_selftest: cublasSgemm failed (%d)\n", int(s));
      return 1;
    }
    report("sgemm", dy.get(), want, 1e-4);
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
  std::printf("cuda_selftest: %s\n", failures ? "FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
