// The CPU's sampling helpers (kernels/cpu/sampling.h). Each row is computed on its own, so its results do not
// depend on the other rows of the call.

#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/backend.h"

namespace choreo::kernels::cpu {

void top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values) {
  check_top_k(n_rows, n_vocab, k);
  std::vector<int32_t> order(static_cast<size_t>(n_vocab));
  for (int r = 0; r < n_rows; ++r) {
    const float* row = logits + size_t(r) * size_t(n_vocab);
    std::iota(order.begin(), order.end(), 0);
    // The order is strict and total (indices are distinct), so the first k are the same whatever the algorithm.
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int j = 0; j < k; ++j) {
      ids[size_t(r) * size_t(k) + size_t(j)] = order[size_t(j)];
      values[size_t(r) * size_t(k) + size_t(j)] = row[order[size_t(j)]];
    }
  }
}

void softmax(const float* x, int n_rows, int n, float temperature, float* out) {
  check_softmax(n_rows, n, temperature);
  for (int r = 0; r < n_rows; ++r) {
    const float* row = x + size_t(r) * size_t(n);
    float* o = out + size_t(r) * size_t(n);
    const double max = double(*std::max_element(row, row + n));
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += std::exp((double(row[i]) - max) / double(temperature));
    for (int i = 0; i < n; ++i) o[i] = float(std::exp((double(row[i]) - max) / double(temperature)) / sum);
  }
}

}  // namespace choreo::kernels::cpu
