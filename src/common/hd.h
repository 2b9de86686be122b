// CG_HD marks small inline functions that the CUDA decoder runs on the device
// as well as on the host (src/codec/cachegen/gpu_core.h): `__host__ __device__`
// under nvcc, nothing for the host compiler.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CG_HD __host__ __device__
#else
#define CG_HD
#endif

namespace cachegen {

// std::bit_cast is not usable in device code; a builtin memcpy of a register
// compiles to the same move on both sides.
template <typename To, typename From>
CG_HD inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  __builtin_memcpy(&to, &from, sizeof(To));
  return to;
}

}  // namespace cachegen
