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

// Channel c: QuantizeValue's rounding, then, where that is within M + 1, the
// magnitude the thresholds give on v's side.
inline void LloydValue(const LloydRowInput& in, uint32_t c, int32_t* q, float* rec, float* level) {
  const float r = in.row[c] - in.pred[c];
  int32_t best = QuantizeValue(r, in.inv[c]);
  if (uint32_t(std::abs(best)) <= in.M + 1) {
    const float v = r * in.inv[c], av = std::fabs(v);
    const size_t side = v < 0 ? in.M + 1 : 0;
    int32_t m = 0;
    while (uint32_t(m) <= in.M && av > in.thr[(side + m) * in.thr_stride + c]) ++m;
    best = v < 0 ? -m : m;
  }
  q[c] = best;
  level[c] = LevelOf(in, best);
  rec[c] = in.pred[c] + level[c] * in.st[c];
}

#if defined(__x86_64__)
#define CG_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

CG_AVX2_INLINE __m256i ZigZag8(__m256i x) {
  return _mm256_xor_si256(_mm256_slli_epi32(x, 1), _mm256_srai_epi32(x, 31));
}

// 8 channels at a time with the scalar form's float operations: the same
// rounding, all M + 1 thresholds compared (they rise with k, but leaving once
// no lane passes one mispredicts: about a third slower), and the levels
// looked up in registers (one codebook for the row: permutes of 8 levels at
// a time, no gathers).
__attribute__((target("avx2"))) void LloydRowAvx2(const LloydRowInput& in, int32_t* q, float* rec, float* level) {
  const __m256 hi = _mm256_set1_ps(float(kMaxAbsSymbol)), lo = _mm256_set1_ps(-float(kMaxAbsSymbol));
  const __m256 sign_bit = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  const __m256i m_top1 = _mm256_set1_epi32(int32_t(in.M + 1)), m_top2 = _mm256_set1_epi32(int32_t(in.M + 2));
  // The codebook's 2M + 1 levels in registers of 8 (unused entries 0).
  constexpr uint32_t kBlocks = (2 * kMaxCodebookLevels + 1 + 7) / 8;
  alignas(32) float table[kBlocks * 8] = {};
  const uint32_t n_levels = 2 * in.M + 1, blocks = (n_levels + 7) / 8;
  for (uint32_t u = 0; u < n_levels; ++u) table[u] = in.levels[u];
  __m256 block[kBlocks];
  for (uint32_t b = 0; b < blocks; ++b) block[b] = _mm256_load_ps(table + 8 * b);
  const size_t side_at = size_t{in.M + 1} * in.thr_stride;
  uint32_t c = 0;
  for (; c + 8 <= in.n; c += 8) {
    const __m256 p = _mm256_loadu_ps(in.pred + c);
    const __m256 r = _mm256_sub_ps(_mm256_loadu_ps(in.row + c), p);
    const __m256 v = _mm256_mul_ps(r, _mm256_loadu_ps(in.inv + c));
    const __m256 vc = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
    const __m256i q0 = _mm256_cvttps_epi32(_mm256_add_ps(vc, _mm256_or_ps(_mm256_and_ps(vc, sign_bit), half)));
    const __m256i small = _mm256_cmpgt_epi32(m_top2, _mm256_abs_epi32(q0));  // |q0| <= M + 1
    const __m256 av = _mm256_andnot_ps(sign_bit, v);
    const __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256i m = _mm256_setzero_si256();
    const float* t = in.thr + c;
    for (uint32_t k = 0; k <= in.M; ++k, t += in.thr_stride) {
      const __m256 thr = _mm256_blendv_ps(_mm256_loadu_ps(t), _mm256_loadu_ps(t + side_at), neg);
      const __m256i above = _mm256_castps_si256(_mm256_cmp_ps(av, thr, _CMP_GT_OQ));
      m = _mm256_sub_epi32(m, above);
    }
    const __m256i signed_m = _mm256_sub_epi32(_mm256_xor_si256(m, _mm256_castps_si256(neg)), _mm256_castps_si256(neg));
    const __m256i best = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(q0), _mm256_castsi256_ps(signed_m), _mm256_castsi256_ps(small)));
    // Levels: the codebook's within M (the block b holds u in [8b, 8b + 8)), else the symbol's value.
    const __m256i u = ZigZag8(best);
    __m256 lev = _mm256_cvtepi32_ps(best);
    const __m256i in_book = _mm256_cmpgt_epi32(m_top1, _mm256_abs_epi32(best));  // |best| <= M
    const __m256i ub = _mm256_srli_epi32(u, 3);
    for (uint32_t b = 0; b < blocks; ++b) {
      const __m256i here = _mm256_and_si256(in_book, _mm256_cmpeq_epi32(ub, _mm256_set1_epi32(int32_t(b))));
      lev = _mm256_blendv_ps(lev, _mm256_permutevar8x32_ps(block[b], u), _mm256_castsi256_ps(here));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + c), best);
    _mm256_storeu_ps(level + c, lev);
    _mm256_storeu_ps(rec + c, _mm256_add_ps(p, _mm256_mul_ps(lev, _mm256_loadu_ps(in.st + c))));
  }
  for (; c < in.n; ++c) LloydValue(in, c, q, rec, level);
}
#endif

void GatherRowsScalar(const float* table, const int32_t* at, uint32_t n, uint32_t rows, float* out) {
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t c = 0; c < n; ++c) out[size_t{r} * n + c] = table[at[c] + r];
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void GatherRowsAvx2(const float* table, const int32_t* at, uint32_t n, uint32_t rows,
                                                    float* out) {
  const uint32_t blocks = n / 8 * 8;
  for (uint32_t c = 0; c < blocks; c += 8) {
    const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + c));
    for (uint32_t r = 0; r < rows; ++r)
      _mm256_storeu_ps(out + size_t{r} * n + c, _mm256_i32gather_ps(table + r, idx, 4));
  }
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t c = blocks; c < n; ++c) out[size_t{r} * n + c] = table[at[c] + r];
}
#endif

}  // namespace

void GatherRows(const float* table, const int32_t* at, uint32_t n, uint32_t rows, float* out) {
#if defined(__x86_64__)
  if (simd::Avx2()) return GatherRowsAvx2(table, at, n, rows, out);
#endif
  GatherRowsScalar(table, at, n, rows, out);
}

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

void LloydThresholds(const float* levels, uint32_t M, const float* cost, float* thr) {
  for (uint32_t side = 0; side < 2; ++side) {
    // Candidate m's distortion plus cost at |v| = x is x^2 - 2 y_m x + y_m^2 +
    // c_m: without x^2 a line of slope -2 y_m. Lines in rising magnitude
    // (rising level), kept while they can be the least somewhere (a convex
    // hull, O(M)); hull[i] is least from x[i] (x[0] = -inf) on.
    float y[kMaxCodebookLevels + 2], b[kMaxCodebookLevels + 2], x[kMaxCodebookLevels + 2];
    uint32_t hull[kMaxCodebookLevels + 2], n = 0;
    for (uint32_t m = 0; m <= M + 1; ++m) {
      const uint32_t u = m == 0 ? 0 : side == 0 ? 2 * m : 2 * m - 1;
      const float ym = m == 0 ? 0.0f : m > M ? float(m) : side == 0 ? levels[u] : -levels[u];
      const float bm = ym * ym + cost[u];
      if (n > 0 && !(ym > y[hull[n - 1]])) continue;
      float xm = -INFINITY;
      while (n > 0) {
        const uint32_t top = hull[n - 1];
        xm = (bm - b[top]) / (2 * (ym - y[top]));
        if (n == 1 || xm > x[n - 1]) break;
        --n;  // the new line is least wherever the top one was
      }
      y[m] = ym, b[m] = bm;
      hull[n] = m, x[n] = n == 0 ? -INFINITY : xm;
      ++n;
    }
    // Magnitude >= k from the first hull line of magnitude >= k on.
    for (uint32_t k = 1, i = 0; k <= M + 1; ++k) {
      while (i < n && hull[i] < k) ++i;
      thr[side * (M + 1) + k - 1] = i < n ? x[i] : INFINITY;
    }
  }
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
