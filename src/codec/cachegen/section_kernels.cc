#include "codec/cachegen/section_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "codec/cachegen/section_format.h"
#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen {

namespace {

// ChannelSums, compiled twice; the AVX2 clone is chosen at run time.
template <int kVariant>
__attribute__((always_inline)) inline void ChannelSumsImpl(const float* y, uint32_t tokens, uint32_t C, double* sum,
                                                           double* sum_sq) {
  for (uint32_t t = 0; t < tokens; ++t) {
    const float* row = y + size_t{t} * C;
    for (uint32_t c = 0; c < C; ++c) {
      const double v = row[c];
      sum[c] += v;
      sum_sq[c] += v * v;
    }
  }
}
void ChannelSumsScalar(const float* y, uint32_t tokens, uint32_t C, double* sum, double* sum_sq) {
  ChannelSumsImpl<0>(y, tokens, C, sum, sum_sq);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void ChannelSumsAvx2(const float* y, uint32_t tokens, uint32_t C, double* sum,
                                                     double* sum_sq) {
  ChannelSumsImpl<1>(y, tokens, C, sum, sum_sq);
}
#endif

void QuantizeRowScalar(const float* row, const float* pred, const float* st, const float* inv, uint32_t n,
                       uint32_t* sym, float* out) {
  for (uint32_t c = 0; c < n; ++c) {
    const int32_t q = QuantizeValue(row[c] - pred[c], inv[c]);
    sym[c] = ZigZag(q);
    if (out) out[c] = pred[c] + static_cast<float>(q) * st[c];
  }
}
#if defined(__x86_64__)
// The same 8 values at a time, bit for bit: the clamp as QuantizeValue's
// std::min/std::max (maxps/minps with the bound first keep their NaN rule),
// copysign as a sign-bit or, truncating conversion.
__attribute__((target("avx2"))) void QuantizeRowAvx2(const float* row, const float* pred, const float* st,
                                                     const float* inv, uint32_t n, uint32_t* sym, float* out) {
  const __m256 hi = _mm256_set1_ps(float(kMaxAbsSymbol)), lo = _mm256_set1_ps(-float(kMaxAbsSymbol));
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  uint32_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 p = _mm256_loadu_ps(pred + c);
    const __m256 r = _mm256_sub_ps(_mm256_loadu_ps(row + c), p);
    const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(r, _mm256_loadu_ps(inv + c))));
    const __m256i q = _mm256_cvttps_epi32(_mm256_add_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign), half)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sym + c),
                        _mm256_xor_si256(_mm256_slli_epi32(q, 1), _mm256_srai_epi32(q, 31)));
    if (out) _mm256_storeu_ps(out + c, _mm256_add_ps(p, _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(st + c))));
  }
  QuantizeRowScalar(row + c, pred + c, st + c, inv + c, n - c, sym + c, out ? out + c : nullptr);
}
#endif

// The level symbol q reconstructs at: the codebook's within M, else q.
inline float LevelOf(const LloydRowInput& in, int32_t q) {
  return uint32_t(std::abs(q)) <= in.M ? in.levels[ZigZag(q)] : static_cast<float>(q);
}

// Channel c: QuantizeValue's rounding, then, where that is within one of the
// codebook's range, the cheapest of the rounded magnitude and its
// neighbours (the first in rising magnitude on a tie).
inline void LloydValue(const LloydRowInput& in, uint32_t c, int32_t* q, float* rec, float* level) {
  const float r = in.row[c] - in.pred[c];
  int32_t best = QuantizeValue(r, in.inv[c]);
  const uint32_t a = static_cast<uint32_t>(std::abs(best));
  if (a <= in.M + 1) {
    const float v = r * in.inv[c];
    const int32_t sign = v < 0 ? -1 : 1;
    const float* cost = in.cost + in.cost_at[c];
    float best_cost = INFINITY;
    for (uint32_t m = a > 0 ? a - 1 : 0; m <= std::min(a + 1, in.M + 1); ++m) {
      const int32_t qq = sign * int32_t(m);
      const float e = v - LevelOf(in, qq);
      const float j = e * e + cost[ZigZag(qq)];
      if (j < best_cost) best_cost = j, best = qq;
    }
  }
  q[c] = best;
  level[c] = LevelOf(in, best);
  rec[c] = in.pred[c] + level[c] * in.st[c];
}

#if defined(__x86_64__)
#define CG_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

// Unsigned a <= b.
CG_AVX2_INLINE __m256i LessEqualU(__m256i a, __m256i b) { return _mm256_cmpeq_epi32(_mm256_min_epu32(a, b), a); }
CG_AVX2_INLINE __m256i ZigZag8(__m256i x) {
  return _mm256_xor_si256(_mm256_slli_epi32(x, 1), _mm256_srai_epi32(x, 31));
}
// The levels of symbols x (|x| = m) in lanes `enabled`: gathered within M,
// else x.
CG_AVX2_INLINE __m256 LevelOf8(const LloydRowInput& in, __m256i x, __m256i m, __m256i enabled) {
  const __m256i in_book = _mm256_and_si256(enabled, LessEqualU(m, _mm256_set1_epi32(int32_t(in.M))));
  const __m256 gathered =
      _mm256_mask_i32gather_ps(_mm256_setzero_ps(), in.levels, ZigZag8(x), _mm256_castsi256_ps(in_book), 4);
  return _mm256_blendv_ps(_mm256_cvtepi32_ps(x), gathered, _mm256_castsi256_ps(in_book));
}

// 8 channels at a time with the scalar form's float operations in its order
// (multiplies and adds, no fused ones), masked gathers for the levels and
// costs (lanes outside the codebook's range read nothing), and strict
// less-than over the candidates in rising magnitude, as the scalar loop.
__attribute__((target("avx2"))) void LloydRowAvx2(const LloydRowInput& in, int32_t* q, float* rec, float* level) {
  const __m256 hi = _mm256_set1_ps(float(kMaxAbsSymbol)), lo = _mm256_set1_ps(-float(kMaxAbsSymbol));
  const __m256 sign_bit = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256i one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
  const __m256i m_top1 = _mm256_set1_epi32(int32_t(in.M + 1));
  uint32_t c = 0;
  for (; c + 8 <= in.n; c += 8) {
    const __m256 p = _mm256_loadu_ps(in.pred + c);
    const __m256 r = _mm256_sub_ps(_mm256_loadu_ps(in.row + c), p);
    const __m256 v = _mm256_mul_ps(r, _mm256_loadu_ps(in.inv + c));
    const __m256 vc = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
    const __m256i q0 = _mm256_cvttps_epi32(_mm256_add_ps(vc, _mm256_or_ps(_mm256_and_ps(vc, sign_bit), half)));
    const __m256i a = _mm256_abs_epi32(q0);
    const __m256i small = LessEqualU(a, m_top1);
    // sign -1 where v < 0 (as the scalar form: -0 and +0 count as positive).
    const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
    const __m256i first = _mm256_sub_epi32(a, _mm256_andnot_si256(_mm256_cmpeq_epi32(a, zero), one));
    const __m256i last = _mm256_min_epu32(_mm256_add_epi32(a, one), m_top1);
    const __m256i cost_at = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.cost_at + c));
    __m256i best = q0;
    __m256 best_cost = inf;
    if (!_mm256_testz_si256(small, small)) {
      for (int k = 0; k < 3; ++k) {
        const __m256i m = _mm256_add_epi32(first, _mm256_set1_epi32(k));
        const __m256i valid = _mm256_and_si256(small, LessEqualU(m, last));
        if (_mm256_testz_si256(valid, valid)) break;
        const __m256i qq = _mm256_sub_epi32(_mm256_xor_si256(m, neg), neg);  // -m where neg
        const __m256 e = _mm256_sub_ps(v, LevelOf8(in, qq, m, valid));
        const __m256 cost = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), in.cost, _mm256_add_epi32(cost_at, ZigZag8(qq)),
                                                     _mm256_castsi256_ps(valid), 4);
        const __m256 j = _mm256_add_ps(_mm256_mul_ps(e, e), cost);
        const __m256 better =
            _mm256_and_ps(_mm256_castsi256_ps(valid), _mm256_cmp_ps(j, best_cost, _CMP_LT_OQ));
        best = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best), _mm256_castsi256_ps(qq), better));
        best_cost = _mm256_blendv_ps(best_cost, j, better);
      }
    }
    const __m256 lev = LevelOf8(in, best, _mm256_abs_epi32(best), _mm256_set1_epi32(-1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + c), best);
    _mm256_storeu_ps(level + c, lev);
    _mm256_storeu_ps(rec + c, _mm256_add_ps(p, _mm256_mul_ps(lev, _mm256_loadu_ps(in.st + c))));
  }
  for (; c < in.n; ++c) LloydValue(in, c, q, rec, level);
}
#endif

}  // namespace

void ChannelSums(const float* y, uint32_t tokens, uint32_t C, double* sum, double* sum_sq) {
#if defined(__x86_64__)
  if (simd::Avx2()) return ChannelSumsAvx2(y, tokens, C, sum, sum_sq);
#endif
  ChannelSumsScalar(y, tokens, C, sum, sum_sq);
}

void QuantizeRow(const float* row, const float* pred, const float* st, const float* inv, uint32_t n, uint32_t* sym,
                 float* out) {
#if defined(__x86_64__)
  if (simd::Avx2()) return QuantizeRowAvx2(row, pred, st, inv, n, sym, out);
#endif
  QuantizeRowScalar(row, pred, st, inv, n, sym, out);
}

void LloydRowScalar(const LloydRowInput& in, int32_t* q, float* rec, float* level) {
  for (uint32_t c = 0; c < in.n; ++c) LloydValue(in, c, q, rec, level);
}

void LloydRow(const LloydRowInput& in, int32_t* q, float* rec, float* level) {
#if defined(__x86_64__)
  if (simd::Avx2()) return LloydRowAvx2(in, q, rec, level);
#endif
  LloydRowScalar(in, q, rec, level);
}

}  // namespace cachegen
