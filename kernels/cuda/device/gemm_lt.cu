// kernels/cuda/device/gemm_lt.h: blas::Gemm on cuBLASLt, one pinned algorithm per shape.
//
// cuBLASLt is loaded with dlopen when the first CUDA device backend is made, not linked: the library is half a
// gigabyte, and linking it would make every choreo process map it (and fail to start under a tight address
// space limit) though only `--backend cuda` uses it. The header gives the functions' types.

#include <cublas_api.h>
#include <cublasLt.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <memory>
#include <set>
#include <string>
#include <tuple>

#include "kernels/cuda/backend_errors.h"
#include "kernels/cuda/device/cuda_backend.h"
#include "kernels/cuda/device/gemm_lt.h"

namespace choreo::cuda {

namespace {

/// The cuBLASLt functions this file calls, from the shared library.
struct Lt {
#define CHOREO_LT_FUNCTIONS(X)                                                                                 \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusString) X(cublasLtMatmulDescCreate)                  \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate)                 \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate)         \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic) \
  X(cublasLtMatmulAlgoConfigSetAttribute) X(cublasLtMatmulAlgoCheck) X(cublasLtMatmul)
#define CHOREO_LT_MEMBER(fn) decltype(&::fn) fn = nullptr;
  CHOREO_LT_FUNCTIONS(CHOREO_LT_MEMBER)
#undef CHOREO_LT_MEMBER
};

/// cuBLASLt of this toolkit's major version, loaded once; an InputError when it cannot be.
const Lt& lt() {
  static Lt loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string file = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library)
      throw_input_error("the CUDA backend cannot load " + file + ": " + dlerror(),
                        "install the CUDA toolkit's cuBLAS (its lib64 on the loader's path, or LD_LIBRARY_PATH)");
    Lt l;
#define CHOREO_LT_LOAD(fn)                                                     \
  l.fn = reinterpret_cast<decltype(&::fn)>(dlsym(library, #fn));               \
  if (!l.fn) throw_input_error(file + " has no " #fn, "install a matching CUDA toolkit");
    CHOREO_LT_FUNCTIONS(CHOREO_LT_LOAD)
#undef CHOREO_LT_LOAD
    loaded = l;  // the library stays loaded for the life of the process
  });
  return loaded;
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_runtime_failure(std::string("cuBLASLt: ") + what + " failed: " + lt().cublasLtGetStatusString(s));
}

cudaDataType_t data_type(blas::Type t) {
  switch (t) {
    case blas::Type::F32: return CUDA_R_32F;
    case blas::Type::F16: return CUDA_R_16F;
    case blas::Type::BF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

cublasOperation_t op(blas::Op o) { return o == blas::Op::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { lt().cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { lt().cublasLtMatrixLayoutDestroy(l); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { lt().cublasLtMatmulPreferenceDestroy(p); }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

/// The descriptors of g's product with `rows` columns of B and C (the row count of choreo's product).
struct Problem {
  Desc desc;
  Layout a, b, c;

  Problem(const blas::Gemm& g, int rows) {
    cublasLtMatmulDesc_t d = nullptr;
    check(lt().cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    desc.reset(d);
    const cublasOperation_t ta = op(g.op_a), tb = op(g.op_b);
    check(lt().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    check(lt().cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    const cudaDataType_t t = data_type(g.type);
    a = layout(t, g.op_a == blas::Op::N ? g.m : g.k, g.op_a == blas::Op::N ? g.k : g.m, g.lda, g.batch, g.stride_a);
    b = layout(t, g.op_b == blas::Op::N ? g.k : rows, g.op_b == blas::Op::N ? rows : g.k, g.ldb, g.batch, g.stride_b);
    c = layout(CUDA_R_32F, g.m, rows, g.ldc, g.batch, g.stride_c);
  }

  static Layout layout(cudaDataType_t t, int rows, int cols, int ld, int batch, int64_t stride) {
    cublasLtMatrixLayout_t l = nullptr;
    check(lt().cublasLtMatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), int64_t(ld)), "cublasLtMatrixLayoutCreate");
    Layout owned(l);
    if (batch > 1) {
      const int32_t count = batch;
      check(lt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "set BATCH_COUNT");
      check(lt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
            "set STRIDED_BATCH_OFFSET");
    }
    return owned;
  }
};

/// A product's shape, everything but its row count.
using Shape = std::tuple<int, int, int, int, int, int, int, int, int, int64_t, int64_t, int64_t>;
Shape shape_of(const blas::Gemm& g) {
  return {int(g.type), int(g.op_a), int(g.op_b), g.m, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c};
}

}  // namespace

struct PinnedGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  struct Pinned {
    cublasLtMatmulAlgo_t algo;
    std::set<int> rows_checked;  // row counts cublasLtMatmulAlgoCheck accepted
  };
  std::map<Shape, Pinned> pinned;

  /// The heuristic's algorithms for g's shape at kReferenceRows rows, with no workspace; the first that takes
  /// split-K 1 and no reduction scheme.
  cublasLtMatmulAlgo_t choose(const blas::Gemm& g) {
    const Problem p(g, kReferenceRows);
    cublasLtMatmulPreference_t pref = nullptr;
    check(lt().cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const Preference owned(pref);
    const uint64_t workspace = 0;
    check(lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace),
          "set MAX_WORKSPACE_BYTES");
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int found = 0;
    check(lt().cublasLtMatmulAlgoGetHeuristic(handle, p.desc.get(), p.a.get(), p.b.get(), p.c.get(), p.c.get(), pref, 8, results,
                                         &found),
          "cublasLtMatmulAlgoGetHeuristic");
    for (int i = 0; i < found; ++i) {
      if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
      cublasLtMatmulAlgo_t algo = results[i].algo;
      const int32_t splits = 1;
      const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
      if (lt().cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) !=
              CUBLAS_STATUS_SUCCESS ||
          lt().cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof reduction) !=
              CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t checked = {};
      if (lt().cublasLtMatmulAlgoCheck(handle, p.desc.get(), p.a.get(), p.b.get(), p.c.get(), p.c.get(), &algo, &checked) ==
              CUBLAS_STATUS_SUCCESS &&
          checked.workspaceSize == 0)
        return algo;
    }
    throw_runtime_failure("cuBLASLt has no algorithm without split-K or workspace for a product of " + std::to_string(g.m) +
                          " x " + std::to_string(g.k));
  }
};

void load_blas_library() { lt(); }

PinnedGemm::PinnedGemm() : impl_(std::make_unique<Impl>()) { check(lt().cublasLtCreate(&impl_->handle), "cublasLtCreate"); }
PinnedGemm::~PinnedGemm() { lt().cublasLtDestroy(impl_->handle); }

void PinnedGemm::run(const blas::Gemm& g, cudaStream_t stream) {
  blas::check(g);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const Shape shape = shape_of(g);
  auto it = impl_->pinned.find(shape);
  if (it == impl_->pinned.end()) it = impl_->pinned.emplace(shape, Impl::Pinned{impl_->choose(g), {}}).first;
  Impl::Pinned& pinned = it->second;
  const Problem p(g, g.n);
  if (!pinned.rows_checked.count(g.n)) {
    cublasLtMatmulHeuristicResult_t checked = {};
    const cublasStatus_t s =
        lt().cublasLtMatmulAlgoCheck(impl_->handle, p.desc.get(), p.a.get(), p.b.get(), p.c.get(), p.c.get(), &pinned.algo, &checked);
    if (s != CUBLAS_STATUS_SUCCESS || checked.workspaceSize != 0)
      throw_runtime_failure("cuBLASLt: the algorithm pinned for a product of " + std::to_string(g.m) + " x " +
                            std::to_string(g.k) + " does not take " + std::to_string(g.n) +
                            " rows; another would break batch invariance");
    pinned.rows_checked.insert(g.n);
  }
  check(lt().cublasLtMatmul(impl_->handle, p.desc.get(), &g.alpha, g.a, p.a.get(), g.b, p.b.get(), &g.beta, g.c, p.c.get(), g.c,
                       p.c.get(), &pinned.algo, nullptr, 0, stream),
        "cublasLtMatmul");
}

}  // namespace choreo::cuda
