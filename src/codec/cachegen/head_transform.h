// Learned per-head orthonormal transforms of a model profile (KLT).
//
// Keys of one head are strongly correlated across channels even with RoPE
// undone (stories260K: the KLT's coding gain is 0.25-0.9 bits per key value,
// the same on text not trained on); V heads barely are. The codec's steps
// follow each coded channel's scale, so in the KLT basis the coding error
// takes the shape of the keys' own covariance: a query in any direction sees
// logit noise in proportion to its logits' spread across keys, where per-channel
// coding of correlated channels swamps the directions in which keys vary little.
// On stories260K that cut the mean KL at equal bits by 31-70 % (docs/results/eval.md).
// A profile may hold, per section, one orthonormal D x D matrix U per KV head
// (row-major, U[r * D + c]): the codec codes y = U^T x (channel c of the
// coding domain is component c) and decoders restore x = U y.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/status.h"

namespace cachegen {

// out = A^T in for one head, A row-major d x d (in and out must not overlap):
// out[c] = fma(A[r][c], in[r], out[c]) over r in order from 0, a chain of
// fused multiply-adds that every decoder computes alike (scalar std::fma,
// AVX2 vfmadd).
void TransposeTimes(const float* a, const float* in, float* out, uint32_t d);
// The same for `rows` rows at once, row i of in and of out starting at
// i * stride (stride >= d; in and out not overlapping): the same bits as one
// call per row, faster from 2 rows on.
void TransposeTimesRows(const float* a, const float* in, float* out, uint32_t d, uint32_t rows, size_t stride);
// Coding: y = U^T x.
inline void HeadToCoding(const float* u, const float* x, float* y, uint32_t d) { TransposeTimes(u, x, y, d); }
// Decoding: x = U y, given ut = U^T (row-major), whose transpose U is.
inline void HeadFromCoding(const float* ut, const float* y, float* x, uint32_t d) { TransposeTimes(ut, y, x, d); }
// The same for `rows` rows of one head, `stride` floats apart.
inline void HeadRowsToCoding(const float* u, const float* x, float* y, uint32_t d, uint32_t rows, size_t stride) {
  TransposeTimesRows(u, x, y, d, rows, stride);
}
inline void HeadRowsFromCoding(const float* ut, const float* y, float* x, uint32_t d, uint32_t rows, size_t stride) {
  TransposeTimesRows(ut, y, x, d, rows, stride);
}
// U^T of a d x d matrix.
std::vector<float> Transposed(std::span<const float> u, uint32_t d);

// The eigenvectors of a d x d covariance matrix (row-major; symmetrised), as
// the columns of U, ordered by decreasing variance, each with its largest
// component positive (so the same data gives the same matrix).
std::vector<float> LearnHeadTransform(std::span<const double> covariance, uint32_t d);

// Whether `u` (d x d) may be used as a transform: finite, and every column
// of unit length within 1e-3, which bounds a decoded head's norm by sqrt(d)
// times the coded one's (a hostile profile can make output wrong, never huge).
Status CheckHeadTransform(std::span<const float> u, uint32_t d);

}  // namespace cachegen
