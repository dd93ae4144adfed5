#pragma once
// Tensor element types, numbered exactly as ggml/GGUF numbers them, with their block geometry.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace choreo::kernels {

/// A GGUF tensor type id (ggml_type). Only some are computable (see is_supported); all known ones can be
/// sized so that `model info` can describe any GGUF file.
enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35,
};

/// Elements per block and bytes per block of a type; block_elems == 0 means "unknown type".
struct TypeTraits {
  std::string_view name;
  uint32_t block_elems;
  uint32_t block_bytes;
};

TypeTraits type_traits(uint32_t type_id);
inline TypeTraits type_traits(DType t) { return type_traits(static_cast<uint32_t>(t)); }

/// True for the types choreo can compute with: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
bool is_supported(DType t);

/// Bytes of one row of n_elems elements (n_elems must be a multiple of the block size).
inline size_t row_bytes(DType t, int64_t n_elems) {
  TypeTraits tr = type_traits(t);
  return static_cast<size_t>(n_elems / tr.block_elems) * tr.block_bytes;
}

}  // namespace choreo::kernels
