#pragma once
// Which SIMD kernels the CPU matrix products use: detected once from cpuid, lowered by $CHOREO_SIMD
// (scalar|avx2|avx512), or forced by tests with set_simd_level.

#include <optional>
#include <string_view>

namespace choreo::kernels::cpu {

/// An instruction-set tier of the CPU kernels, from portable C++ to AVX-512 with VNNI.
enum class SimdLevel {
  Scalar = 0,  // plain C++, any x86-64 (and the reference the others are tested against)
  Avx2 = 1,    // AVX2 + FMA + F16C
  Avx512 = 2,  // AVX-512 F/BW/VL/DQ + VNNI (machines with AVX-512 but no VNNI use Avx2)
};

/// The best level this processor supports, ignoring $CHOREO_SIMD.
SimdLevel detected_simd_level();

/// The level in force: set_simd_level's if called, else $CHOREO_SIMD's (never above detection), else
/// detected. Throws InputError when $CHOREO_SIMD names no level.
SimdLevel simd_level();

/// Forces the level used from now on (tests compare levels). Throws InputError above detected_simd_level().
void set_simd_level(SimdLevel level);

/// "scalar", "avx2" or "avx512".
std::string_view simd_level_name(SimdLevel level);

/// Parses a name as simd_level_name spells it; nullopt for anything else.
std::optional<SimdLevel> parse_simd_level(std::string_view name);

}  // namespace choreo::kernels::cpu
