// IEEE binary16 and bfloat16 conversions (round to nearest even), scalar.
// Written here rather than taken from a package: it is three small functions
// and the decoder's hot path must inline them. CG_HD: the CUDA decoder runs
// these same functions, so its f16/bf16 output is bit-identical.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace cachegen {

CG_HD inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return BitCast<float>(sign | 0x7f800000u | (man << 13));  // Inf/NaN
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    const float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  return BitCast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

CG_HD inline uint16_t F32ToF16(float f) {
  const uint32_t x = BitCast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (absx < 0x38800000u) {
    // Result is subnormal or zero: round absx * 2^24 to an integer, ties to even.
    const float scaled = BitCast<float>(absx) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, ties to even.
  const uint32_t rounded = absx + 0xfffu + ((absx >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

CG_HD inline float BF16ToF32(uint16_t b) { return BitCast<float>(uint32_t{b} << 16); }

CG_HD inline uint16_t F32ToBF16(float f) {
  const uint32_t x = BitCast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Rounds a float to the nearest f16-representable value (as float).
CG_HD inline float RoundToF16(float f) { return F16ToF32(F32ToF16(f)); }

}  // namespace cachegen
