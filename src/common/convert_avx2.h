// AVX2 pieces of the row conversions (convert.cc) shared with decoders that
// convert values still in registers (the fused cachegen section decoder).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace cachegen::avx2 {

// F32ToBF16 (half.h) of 8 floats, each result in the low 16 bits of its
// 32-bit lane: round to nearest even, NaN made quiet like the scalar code.
__attribute__((target("avx2"), always_inline)) inline __m256i ToBF16(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

}  // namespace cachegen::avx2
#endif
