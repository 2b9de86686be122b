#include "common/simd.h"

#include <atomic>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <cstdlib>
#include <cstring>

namespace cachegen::simd {
namespace {

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C through cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool EnvAllows() {
  const char* v = std::getenv("CACHEGEN_SIMD");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool CpuHasAvx512AndFma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

std::atomic<bool>& Avx512Flag() {
  static std::atomic<bool> flag{CpuHasAvx512AndFma()};
  return flag;
}

std::atomic<bool>& Flag() {
  static std::atomic<bool> flag{CpuHasAvx2() && EnvAllows()};
  return flag;
}

}  // namespace

bool Avx2() { return Flag().load(std::memory_order_relaxed); }

void SetEnabled(bool enabled) { Flag().store(enabled && CpuHasAvx2(), std::memory_order_relaxed); }

bool Fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool fma = __builtin_cpu_supports("fma");
  return Avx2() && fma;
#else
  return false;
#endif
}

bool Avx512() { return Avx2() && Avx512Flag().load(std::memory_order_relaxed); }

void SetAvx512Enabled(bool enabled) {
  Avx512Flag().store(enabled && CpuHasAvx512AndFma(), std::memory_order_relaxed);
}

}  // namespace cachegen::simd
