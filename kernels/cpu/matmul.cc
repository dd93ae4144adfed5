#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cassert>
#include <new>

#include <sys/mman.h>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"
#include "common/error.h"

namespace choreo::kernels::cpu {

namespace {

void check_weight(const Weight& w, const char* what) {
  if (!is_supported(w.type)) {
    throw InputError(fmt::format("{}: weight type {} is not supported", what, type_traits(w.type).name),
                     "supported types: F32, F16, BF16, Q8_0, Q4_0, Q4_1");
  }
  const uint32_t block = type_traits(w.type).block_elems;
  if (w.n_in <= 0 || w.n_in % block != 0 || w.n_out < 0) {
    throw InputError(
        fmt::format("{}: a {} weight of shape [{}, {}] is not a whole number of {}-element blocks", what,
                    type_traits(w.type).name, w.n_in, w.n_out, block));
  }
  assert(w.data != nullptr || w.n_out == 0);
  assert(w.row_stride >= row_bytes(w.type, w.n_in));
}

}  // namespace

void matmul(const Weight& w, const float* x, int n, float* y) {
  check_weight(w, "matmul");
  if (n <= 0 || w.n_out == 0) return;
  switch (simd_level()) {
    case SimdLevel::Avx512:
      return matmul_avx512(w, x, n, y);
    case SimdLevel::Avx2:
      return matmul_avx2(w, x, n, y);
    case SimdLevel::Scalar:
      return matmul_scalar(w, x, n, y);
  }
}

void matmul_group(std::span<const MatmulOutput> outputs, const float* x, int n) {
  bool together = simd_level() == SimdLevel::Avx512 && !outputs.empty() && outputs.size() <= kMaxGroupWeights;
  for (const MatmulOutput& o : outputs) {
    check_weight(*o.w, "matmul");
    together = together && is_block_quantised(o.w->type) && o.w->type == outputs.front().w->type &&
               o.w->n_in == outputs.front().w->n_in && o.w->n_out > 0;
  }
  if (n <= 0) return;
  if (together) return matmul_group_avx512(outputs, x, n);
  for (const MatmulOutput& o : outputs) matmul(*o.w, x, n, o.y);
}

std::shared_ptr<const void> pack_weight(const Weight& w) {
  check_weight(w, "weight upload");
  if (!is_block_quantised(w.type) || w.n_out == 0 || simd_level() != SimdLevel::Avx512) return nullptr;
  // Anonymous memory of its own, populated in one call rather than page fault by page fault (loading the 1B
  // shape in Q8_0: ~0.45 s for the packing instead of ~1 s). Transparent huge pages (MADV_HUGEPAGE) were
  // measured too: no faster decode, and slower loading.
  const size_t bytes = packed_bytes_avx512(w);
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED) throw std::bad_alloc();
  std::shared_ptr<const void> packed(memory, [bytes](const void* p) { munmap(const_cast<void*>(p), bytes); });
  pack_weight_avx512(w, static_cast<uint8_t*>(memory));
  return packed;
}

int64_t matmul_grain(const Weight& w, int64_t n_units, int64_t unit_rows, int n) {
  constexpr int64_t kMinPieceBytes = 16 << 10;
  const int64_t threads = kernel_pool().threads();
  const int64_t unit_bytes = std::max<int64_t>(1, unit_rows * int64_t(w.row_stride) * n);
  // A whole number of pieces per thread, so that no thread is left with one piece more than another.
  const int64_t pieces =
      (std::clamp<int64_t>(n_units * unit_bytes / kMinPieceBytes, threads, 8 * threads) + threads - 1) / threads *
      threads;
  const int64_t grain = std::max<int64_t>(1, (n_units + pieces - 1) / pieces);
  return n > 8 ? (grain + 1) / 2 * 2 : grain;  // from 9 rows on, AVX-512 multiplies panels two at a time
}

void dequantize_rows(const Weight& w, std::span<const int32_t> rows, float* out) {
  check_weight(w, "embedding lookup");
  for (int32_t row : rows) {
    if (row < 0 || row >= w.n_out) {
      throw InputError(fmt::format("token id {} is outside the vocabulary [0, {})", row, w.n_out));
    }
  }
  const auto n_rows = static_cast<int64_t>(rows.size());
  const auto dequantize = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto* source = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(rows[i]) * w.row_stride;
      dequantize_row(w.type, source, out + i * w.n_in, w.n_in);
    }
  };
  if (n_rows * w.n_in < (1 << 16)) return dequantize(0, n_rows);
  ThreadPool& pool = kernel_pool();
  pool.parallel_for(n_rows, pool.grain_for(n_rows), dequantize);
}

}  // namespace choreo::kernels::cpu
