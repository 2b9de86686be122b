#include "common/simd.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace cachegen::simd {
namespace {

bool CpuHasAvx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool EnvAllows() {
  const char* v = std::getenv("CACHEGEN_SIMD");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

std::atomic<bool>& Flag() {
  static std::atomic<bool> flag{CpuHasAvx2() && EnvAllows()};
  return flag;
}

}  // namespace

bool Avx2() { return Flag().load(std::memory_order_relaxed); }

void SetEnabled(bool enabled) { Flag().store(enabled && CpuHasAvx2(), std::memory_order_relaxed); }

}  // namespace cachegen::simd
