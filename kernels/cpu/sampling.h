#pragma once
// The sampling helpers of kernels::Backend on the CPU (top_k, softmax): row by row, in host memory.

#include <cstdint>

namespace choreo::kernels::cpu {

/// Backend::top_k: each row's k largest logits, value descending, ties by the lower index first.
void top_k(const float* logits, int n_rows, int n_vocab, int k, int32_t* ids, float* values);
/// Backend::softmax: exponentials and their sum in double, the sum in index order.
void softmax(const float* x, int n_rows, int n, float temperature, float* out);

}  // namespace choreo::kernels::cpu
