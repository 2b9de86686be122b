#include "codec/cachegen/head_transform.h"

#include <cmath>
#include <string>

#include <Eigen/Eigenvalues>

#include "common/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace cachegen {

namespace {

// out[c] = fma(a[r][c], in[r], out[c]) for r in order, from 0: a chain of
// fused multiply-adds, one rounding per step, which the scalar loop
// (std::fma) and the AVX2 kernel (vfmadd, 8 outputs per register) compute
// alike; half the operations of a multiply and an add.
void TransposeTimesScalar(const float* a, const float* in, float* out, uint32_t d) {
  for (uint32_t c = 0; c < d; ++c) out[c] = 0;
  for (uint32_t r = 0; r < d; ++r) {
    const float v = in[r];
    const float* ar = a + size_t{r} * d;
    for (uint32_t c = 0; c < d; ++c) out[c] = std::fma(ar[c], v, out[c]);
  }
}

#if defined(__x86_64__)
// Outputs kept in registers, 8 per register, across all of `in`; four
// independent sums hide the latency; the tail of d % 8 outputs as the scalar
// loop.
// Outputs c0.. of TransposeTimesAvx2.
__attribute__((target("avx2,fma"))) void TransposeTimesAvx2Columns(const float* __restrict__ a,
                                                                   const float* __restrict__ in,
                                                                   float* __restrict__ out, uint32_t d, uint32_t c0) {
  for (; c0 + 32 <= d; c0 += 32) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (uint32_t r = 0; r < d; ++r) {
      const float* ar = a + size_t{r} * d + c0;
      const __m256 v = _mm256_set1_ps(in[r]);
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(ar), v, s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 8), v, s1);
      s2 = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 16), v, s2);
      s3 = _mm256_fmadd_ps(_mm256_loadu_ps(ar + 24), v, s3);
    }
    _mm256_storeu_ps(out + c0, s0);
    _mm256_storeu_ps(out + c0 + 8, s1);
    _mm256_storeu_ps(out + c0 + 16, s2);
    _mm256_storeu_ps(out + c0 + 24, s3);
  }
  for (; c0 + 8 <= d; c0 += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t r = 0; r < d; ++r)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + size_t{r} * d + c0), _mm256_set1_ps(in[r]), acc);
    _mm256_storeu_ps(out + c0, acc);
  }
  for (uint32_t c = c0; c < d; ++c) {
    float sum = 0;
    for (uint32_t r = 0; r < d; ++r) sum = std::fma(a[size_t{r} * d + c], in[r], sum);
    out[c] = sum;
  }
}

__attribute__((target("avx2,fma"))) void TransposeTimesAvx2(const float* __restrict__ a,
                                                            const float* __restrict__ in, float* __restrict__ out,
                                                            uint32_t d) {
  TransposeTimesAvx2Columns(a, in, out, d, 0);
}

// The same with 16 outputs per register where the CPU has AVX-512 (each
// output the same chain, so the same bits); d % 16 outputs as TransposeTimesAvx2.
__attribute__((target("avx512f,avx2,fma"))) void TransposeTimesAvx512(const float* __restrict__ a,
                                                                      const float* __restrict__ in,
                                                                      float* __restrict__ out, uint32_t d) {
  uint32_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (uint32_t r = 0; r < d; ++r) {
      const float* ar = a + size_t{r} * d + c0;
      const __m512 v = _mm512_set1_ps(in[r]);
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(ar), v, s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(ar + 16), v, s1);
      s2 = _mm512_fmadd_ps(_mm512_loadu_ps(ar + 32), v, s2);
      s3 = _mm512_fmadd_ps(_mm512_loadu_ps(ar + 48), v, s3);
    }
    _mm512_storeu_ps(out + c0, s0);
    _mm512_storeu_ps(out + c0 + 16, s1);
    _mm512_storeu_ps(out + c0 + 32, s2);
    _mm512_storeu_ps(out + c0 + 48, s3);
  }
  for (; c0 + 16 <= d; c0 += 16) {
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t r = 0; r < d; ++r)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + size_t{r} * d + c0), _mm512_set1_ps(in[r]), acc);
    _mm512_storeu_ps(out + c0, acc);
  }
  if (c0 < d) TransposeTimesAvx2Columns(a, in, out, d, c0);
}

// Several rows through one matrix (rows of `in` and `out` d apart): each
// row's outputs are the single-row chains, so the same bits; what it gains is
// independent chains in flight (one row's 64-step chains wait on the FMA
// latency) and each matrix row loaded once per block of rows.
// AVX-512: blocks of 4 rows x 64 outputs (16 accumulators).
__attribute__((target("avx512f,avx2,fma"))) uint32_t TransposeTimesRowsAvx512(const float* __restrict__ a,
                                                                            const float* __restrict__ in,
                                                                            float* __restrict__ out, uint32_t d,
                                                                            uint32_t rows) {
  if (d % 64 != 0) return 0;
  uint32_t i0 = 0;
  for (; i0 + 4 <= rows; i0 += 4) {
    const float* x = in + size_t{i0} * d;
    float* y = out + size_t{i0} * d;
    for (uint32_t c0 = 0; c0 < d; c0 += 64) {
      __m512 acc[4][4];
      for (auto& row : acc)
        for (auto& v : row) v = _mm512_setzero_ps();
      for (uint32_t r = 0; r < d; ++r) {
        const float* ar = a + size_t{r} * d + c0;
        const __m512 u0 = _mm512_loadu_ps(ar), u1 = _mm512_loadu_ps(ar + 16), u2 = _mm512_loadu_ps(ar + 32),
                     u3 = _mm512_loadu_ps(ar + 48);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512 v = _mm512_set1_ps(x[size_t(i) * d + r]);
          acc[i][0] = _mm512_fmadd_ps(u0, v, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(u1, v, acc[i][1]);
          acc[i][2] = _mm512_fmadd_ps(u2, v, acc[i][2]);
          acc[i][3] = _mm512_fmadd_ps(u3, v, acc[i][3]);
        }
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + size_t(i) * d + c0 + 16 * j, acc[i][j]);
    }
  }
  return i0;
}

// AVX2: blocks of 2 rows x 32 outputs (8 accumulators).
__attribute__((target("avx2,fma"))) uint32_t TransposeTimesRowsAvx2(const float* __restrict__ a,
                                                                   const float* __restrict__ in,
                                                                   float* __restrict__ out, uint32_t d,
                                                                   uint32_t rows) {
  if (d % 32 != 0) return 0;
  uint32_t i0 = 0;
  for (; i0 + 2 <= rows; i0 += 2) {
    const float* x = in + size_t{i0} * d;
    float* y = out + size_t{i0} * d;
    for (uint32_t c0 = 0; c0 < d; c0 += 32) {
      __m256 acc[2][4];
      for (auto& row : acc)
        for (auto& v : row) v = _mm256_setzero_ps();
      for (uint32_t r = 0; r < d; ++r) {
        const float* ar = a + size_t{r} * d + c0;
        const __m256 u0 = _mm256_loadu_ps(ar), u1 = _mm256_loadu_ps(ar + 8), u2 = _mm256_loadu_ps(ar + 16),
                     u3 = _mm256_loadu_ps(ar + 24);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
          const __m256 v = _mm256_set1_ps(x[size_t(i) * d + r]);
          acc[i][0] = _mm256_fmadd_ps(u0, v, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(u1, v, acc[i][1]);
          acc[i][2] = _mm256_fmadd_ps(u2, v, acc[i][2]);
          acc[i][3] = _mm256_fmadd_ps(u3, v, acc[i][3]);
        }
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(y + size_t(i) * d + c0 + 8 * j, acc[i][j]);
    }
  }
  return i0;
}

#endif

}  // namespace

void TransposeTimes(const float* a, const float* in, float* out, uint32_t d) {
#if defined(__x86_64__)
  if (simd::Avx512()) return TransposeTimesAvx512(a, in, out, d);
  if (simd::Fma()) return TransposeTimesAvx2(a, in, out, d);
#endif
  TransposeTimesScalar(a, in, out, d);
}

void TransposeTimesRows(const float* a, const float* in, float* out, uint32_t d, uint32_t rows) {
  uint32_t done = 0;
#if defined(__x86_64__)
  if (simd::Avx512())
    done = TransposeTimesRowsAvx512(a, in, out, d, rows);
  else if (simd::Fma())
    done = TransposeTimesRowsAvx2(a, in, out, d, rows);
#endif
  for (uint32_t i = done; i < rows; ++i) TransposeTimes(a, in + size_t{i} * d, out + size_t{i} * d, d);
}

std::vector<float> Transposed(std::span<const float> u, uint32_t d) {
  std::vector<float> t(u.size());
  for (uint32_t r = 0; r < d; ++r)
    for (uint32_t c = 0; c < d; ++c) t[size_t{c} * d + r] = u[size_t{r} * d + c];
  return t;
}

std::vector<float> LearnHeadTransform(std::span<const double> covariance, uint32_t d) {
  Eigen::MatrixXd cov(d, d);
  for (uint32_t r = 0; r < d; ++r)
    for (uint32_t c = 0; c < d; ++c) cov(r, c) = 0.5 * (covariance[size_t{r} * d + c] + covariance[size_t{c} * d + r]);
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(cov);
  const Eigen::MatrixXd& v = eig.eigenvectors();  // columns, increasing eigenvalues
  std::vector<float> u(size_t{d} * d);
  for (uint32_t c = 0; c < d; ++c) {
    const Eigen::Index col = Eigen::Index(d - 1 - c);
    Eigen::Index top = 0;
    v.col(col).cwiseAbs().maxCoeff(&top);
    const double sign = v(top, col) < 0 ? -1.0 : 1.0;
    for (uint32_t r = 0; r < d; ++r) u[size_t{r} * d + c] = static_cast<float>(sign * v(r, col));
  }
  return u;
}

Status CheckHeadTransform(std::span<const float> u, uint32_t d) {
  if (u.size() != size_t{d} * d) return Status::Corrupt("head transform of the wrong size");
  for (uint32_t c = 0; c < d; ++c) {
    double norm = 0;
    for (uint32_t r = 0; r < d; ++r) {
      const float v = u[size_t{r} * d + c];
      if (!std::isfinite(v)) return Status::Corrupt("head transform with a non-finite entry");
      norm += double(v) * v;
    }
    if (std::abs(norm - 1.0) > 1e-3)
      return Status::Corrupt("head transform column " + std::to_string(c) + " is not of unit length");
  }
  return Status::Ok();
}

}  // namespace cachegen
