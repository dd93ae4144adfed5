#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>

#include "common/error.h"

namespace choreo::kernels::cpu {

namespace {

constexpr int kUnset = -1;

// The forced level, or kUnset; the one piece of process state here, so tests can switch levels.
std::atomic<int>& forced_level() {
  static std::atomic<int> level{kUnset};
  return level;
}

SimdLevel level_from_environment() {
  const SimdLevel detected = detected_simd_level();
  const char* value = std::getenv("CHOREO_SIMD");
  if (value == nullptr || *value == '\0') return detected;
  const std::optional<SimdLevel> wanted = parse_simd_level(value);
  if (!wanted) {
    throw InputError(fmt::format("CHOREO_SIMD={}: unknown SIMD level", value), "use scalar, avx2 or avx512");
  }
  return static_cast<int>(*wanted) < static_cast<int>(detected) ? *wanted : detected;
}

}  // namespace

SimdLevel detected_simd_level() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    // F16C is read from cpuid directly: clang 14's __builtin_cpu_supports does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vnni");
    return avx512 ? SimdLevel::Avx512 : avx2 ? SimdLevel::Avx2 : SimdLevel::Scalar;
  }();
  return level;
}

SimdLevel simd_level() {
  const int forced = forced_level().load(std::memory_order_relaxed);
  if (forced != kUnset) return static_cast<SimdLevel>(forced);
  static const SimdLevel from_environment = level_from_environment();
  return from_environment;
}

void set_simd_level(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(detected_simd_level())) {
    throw InputError(fmt::format("SIMD level {} is not supported by this CPU", simd_level_name(level)),
                     fmt::format("the best available is {}", simd_level_name(detected_simd_level())));
  }
  forced_level().store(static_cast<int>(level), std::memory_order_relaxed);
}

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar:
      return "scalar";
    case SimdLevel::Avx2:
      return "avx2";
    case SimdLevel::Avx512:
      return "avx512";
  }
  return "unknown";
}

std::optional<SimdLevel> parse_simd_level(std::string_view name) {
  for (SimdLevel level : {SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512}) {
    if (name == simd_level_name(level)) return level;
  }
  return std::nullopt;
}

}  // namespace choreo::kernels::cpu
