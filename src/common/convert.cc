#include "common/convert.h"

#include <cstring>

#include "common/half.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "common/convert_avx2.h"
#endif

namespace cachegen {
namespace {

// dst may be any byte address (engine memory): stores go through memcpy.
void StoreF16Scalar(const float* s, size_t n, uint8_t* d) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = F32ToF16(s[i]);
    std::memcpy(d + 2 * i, &h, 2);
  }
}

void StoreBF16Scalar(const float* s, size_t n, uint8_t* d) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = F32ToBF16(s[i]);
    std::memcpy(d + 2 * i, &h, 2);
  }
}

void LoadF16Scalar(const uint8_t* s, size_t n, float* d) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    d[i] = F16ToF32(h);
  }
}

void LoadBF16Scalar(const uint8_t* s, size_t n, float* d) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    d[i] = BF16ToF32(h);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) void StoreF16Avx2(const float* s, size_t n, uint8_t* d) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(s + i);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    if (!_mm256_testz_ps(nan, nan)) {  // F32ToF16 drops NaN payloads; F16C keeps them
      StoreF16Scalar(s + i, 8, d + 2 * i);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  StoreF16Scalar(s + i, n - i, d + 2 * i);
}

__attribute__((target("avx2"))) void StoreBF16Avx2(const float* s, size_t n, uint8_t* d) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = avx2::ToBF16(_mm256_loadu_ps(s + i));
    const __m256i b = avx2::ToBF16(_mm256_loadu_ps(s + i + 8));
    // packus works per 128-bit half: [a0-3 b0-3 a4-7 b4-7]; restore order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 2 * i), packed);
  }
  StoreBF16Scalar(s + i, n - i, d + 2 * i);
}

// F16C converts signalling NaNs to quiet ones; F16ToF32 keeps every bit, so
// blocks holding an Inf/NaN (exponent all ones) take the scalar path.
__attribute__((target("avx2,f16c"))) void LoadF16Avx2(const uint8_t* s, size_t n, float* d) {
  size_t i = 0;
  const __m128i exp_mask = _mm_set1_epi16(0x7c00);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    const __m128i special = _mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask);
    if (!_mm_testz_si128(special, special)) {
      LoadF16Scalar(s + 2 * i, 8, d + i);
      continue;
    }
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  LoadF16Scalar(s + 2 * i, n - i, d + i);
}

__attribute__((target("avx2"))) void LoadBF16Avx2(const uint8_t* s, size_t n, float* d) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(w, 16));
  }
  LoadBF16Scalar(s + 2 * i, n - i, d + i);
}
#endif

}  // namespace

void LoadRow(DType dtype, const void* src, size_t n, float* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16:
#if defined(__x86_64__)
      if (simd::Avx2()) return LoadF16Avx2(s, n, dst);
#endif
      return LoadF16Scalar(s, n, dst);
    case DType::kBF16:
#if defined(__x86_64__)
      if (simd::Avx2()) return LoadBF16Avx2(s, n, dst);
#endif
      return LoadBF16Scalar(s, n, dst);
  }
}

void StoreRow(DType dtype, const float* src, size_t n, void* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16:
#if defined(__x86_64__)
      if (simd::Avx2()) return StoreF16Avx2(src, n, static_cast<uint8_t*>(dst));
#endif
      return StoreF16Scalar(src, n, static_cast<uint8_t*>(dst));
    case DType::kBF16:
#if defined(__x86_64__)
      if (simd::Avx2()) return StoreBF16Avx2(src, n, static_cast<uint8_t*>(dst));
#endif
      return StoreBF16Scalar(src, n, static_cast<uint8_t*>(dst));
  }
}

}  // namespace cachegen
