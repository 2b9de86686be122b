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
// (std::fma) and the SIMD kernels (vfmadd) compute alike; half the
// operations of a multiply and an add.
void TransposeTimesScalar(const float* a, const float* in, float* out, uint32_t d) {
  for (uint32_t c = 0; c < d; ++c) out[c] = 0;
  for (uint32_t r = 0; r < d; ++r) {
    const float v = in[r];
    const float* ar = a + size_t{r} * d;
    for (uint32_t c = 0; c < d; ++c) out[c] = std::fma(ar[c], v, out[c]);
  }
}

#if defined(__x86_64__)
// The SIMD kernels keep outputs in registers across all of `in` and take R
// rows at once (each matrix row loaded once per block, R times the chains in
// flight: one row's chains alone wait on the FMA latency). Every output is
// still its own chain over r in order, so every form gives the scalar bits.

// R rows' outputs c0..c0+31 (AVX2): 4R accumulators of 8.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void Block32(const float* a, const float* in, float* out,
                                                                       uint32_t d, size_t stride, uint32_t c0) {
  __m256 acc[R][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_ps();
  for (uint32_t r = 0; r < d; ++r) {
    const float* ar = a + size_t{r} * d + c0;
    const __m256 u0 = _mm256_loadu_ps(ar), u1 = _mm256_loadu_ps(ar + 8), u2 = _mm256_loadu_ps(ar + 16),
                 u3 = _mm256_loadu_ps(ar + 24);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m256 v = _mm256_set1_ps(in[size_t(i) * stride + r]);
      acc[i][0] = _mm256_fmadd_ps(u0, v, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(u1, v, acc[i][1]);
      acc[i][2] = _mm256_fmadd_ps(u2, v, acc[i][2]);
      acc[i][3] = _mm256_fmadd_ps(u3, v, acc[i][3]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + size_t(i) * stride + c0 + 8 * j, acc[i][j]);
}

// R rows' outputs c0.. (AVX2): blocks of 32, then of 8, then one at a time.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void ColumnsAvx2(const float* a, const float* in,
                                                                           float* out, uint32_t d, size_t stride,
                                                                           uint32_t c0) {
  for (; c0 + 32 <= d; c0 += 32) Block32<R>(a, in, out, d, stride, c0);
  for (; c0 + 8 <= d; c0 += 8) {
    __m256 acc[R];
    for (auto& v : acc) v = _mm256_setzero_ps();
    for (uint32_t r = 0; r < d; ++r) {
      const __m256 u = _mm256_loadu_ps(a + size_t{r} * d + c0);
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(u, _mm256_set1_ps(in[size_t(i) * stride + r]), acc[i]);
    }
    for (int i = 0; i < R; ++i) _mm256_storeu_ps(out + size_t(i) * stride + c0, acc[i]);
  }
  for (int i = 0; i < R; ++i)
    for (uint32_t c = c0; c < d; ++c) {
      float sum = 0;
      for (uint32_t r = 0; r < d; ++r) sum = std::fma(a[size_t{r} * d + c], in[size_t(i) * stride + r], sum);
      out[size_t(i) * stride + c] = sum;
    }
}

// R rows' outputs (AVX-512): blocks of 64 (4R accumulators of 16), then of
// 16, the rest as ColumnsAvx2.
template <int R>
__attribute__((target("avx512f,avx2,fma"), always_inline)) inline void ColumnsAvx512(const float* a, const float* in,
                                                                                     float* out, uint32_t d,
                                                                                     size_t stride) {
  uint32_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) {
    __m512 acc[R][4];
    for (auto& row : acc)
      for (auto& v : row) v = _mm512_setzero_ps();
    for (uint32_t r = 0; r < d; ++r) {
      const float* ar = a + size_t{r} * d + c0;
      const __m512 u0 = _mm512_loadu_ps(ar), u1 = _mm512_loadu_ps(ar + 16), u2 = _mm512_loadu_ps(ar + 32),
                   u3 = _mm512_loadu_ps(ar + 48);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const __m512 v = _mm512_set1_ps(in[size_t(i) * stride + r]);
        acc[i][0] = _mm512_fmadd_ps(u0, v, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(u1, v, acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(u2, v, acc[i][2]);
        acc[i][3] = _mm512_fmadd_ps(u3, v, acc[i][3]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + size_t(i) * stride + c0 + 16 * j, acc[i][j]);
  }
  for (; c0 + 16 <= d; c0 += 16) {
    __m512 acc[R];
    for (auto& v : acc) v = _mm512_setzero_ps();
    for (uint32_t r = 0; r < d; ++r) {
      const __m512 u = _mm512_loadu_ps(a + size_t{r} * d + c0);
      for (int i = 0; i < R; ++i) acc[i] = _mm512_fmadd_ps(u, _mm512_set1_ps(in[size_t(i) * stride + r]), acc[i]);
    }
    for (int i = 0; i < R; ++i) _mm512_storeu_ps(out + size_t(i) * stride + c0, acc[i]);
  }
  ColumnsAvx2<R>(a, in, out, d, stride, c0);
}

__attribute__((target("avx2,fma"))) void RowsAvx2(const float* a, const float* in, float* out, uint32_t d,
                                                  uint32_t rows, size_t stride) {
  uint32_t i = 0;
  for (; i + 2 <= rows; i += 2) ColumnsAvx2<2>(a, in + size_t{i} * stride, out + size_t{i} * stride, d, stride, 0);
  for (; i < rows; ++i) ColumnsAvx2<1>(a, in + size_t{i} * stride, out + size_t{i} * stride, d, stride, 0);
}

__attribute__((target("avx512f,avx2,fma"))) void RowsAvx512(const float* a, const float* in, float* out, uint32_t d,
                                                            uint32_t rows, size_t stride) {
  uint32_t i = 0;
  for (; i + 4 <= rows; i += 4) ColumnsAvx512<4>(a, in + size_t{i} * stride, out + size_t{i} * stride, d, stride);
  for (; i < rows; ++i) ColumnsAvx512<1>(a, in + size_t{i} * stride, out + size_t{i} * stride, d, stride);
}
#endif

}  // namespace

void TransposeTimesRows(const float* a, const float* in, float* out, uint32_t d, uint32_t rows, size_t stride) {
#if defined(__x86_64__)
  if (simd::Avx512()) return RowsAvx512(a, in, out, d, rows, stride);
  if (simd::Fma()) return RowsAvx2(a, in, out, d, rows, stride);
#endif
  for (uint32_t i = 0; i < rows; ++i) TransposeTimesScalar(a, in + size_t{i} * stride, out + size_t{i} * stride, d);
}

void TransposeTimes(const float* a, const float* in, float* out, uint32_t d) {
  TransposeTimesRows(a, in, out, d, 1, d);
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
