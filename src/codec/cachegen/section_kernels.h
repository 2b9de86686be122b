// The section coder's row kernels, each with an AVX2 form that gives its
// scalar form's bits (chosen at run time): channel sums of the analysis, the
// uniform quantizer, and the lloyd quantizer's per-value choice (FORMAT.md,
// cachegen "Encoder choices": for the channels of one row that share a
// codebook, the level that minimises distortion plus lambda * bits among the
// magnitudes up to M + 1, by thresholds), which the encoder runs on every
// row of every pass of codebook learning and of the final quantization.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cachegen {

// Adds each channel's sum and sum of squares over `tokens` rows of C floats,
// in double (means can be large against the spread).
void ChannelSums(const float* y, uint32_t tokens, uint32_t C, double* sum, double* sum_sq);

// One row through the uniform quantizer: sym[c] = ZigZag(QuantizeValue(row[c]
// - pred[c], inv[c])) and, when out is set, the reconstruction out[c] =
// pred[c] + q * st[c] (a multiply, then an add). out may not alias the inputs.
void QuantizeRow(const float* row, const float* pred, const float* st, const float* inv, uint32_t n, uint32_t* sym,
                 float* out);

struct LloydRowInput {
  const float* row;   // values
  const float* pred;  // their predictions (channel means or the group's anchor)
  const float* st;    // steps
  const float* inv;   // 1 / steps
  uint32_t n = 0;     // channels
  // The channels' codebook: levels[u], u = 0..2M (Codebook::Levels), M <= 16.
  const float* levels = nullptr;
  uint32_t M = 0;
  // Channel c's choice thresholds (LloydThresholds), k = 1..M+1 on side s (0:
  // v >= 0, 1: v < 0) at thr[(s * (M + 1) + k - 1) * thr_stride + c].
  const float* thr = nullptr;
  size_t thr_stride = 0;
};

// Where the lloyd choice moves up a magnitude, for one codebook and one rate
// term: a value v (residual in steps) whose rounding is within M + 1 takes,
// on its side, the magnitude m = #{k in 1..M+1 : |v| > thr[side * (M + 1) +
// k - 1]}, which minimises (v - level)^2 + cost over the magnitudes 0..M + 1
// (the lower envelope of the candidates' parabolas; on a tie the smaller).
// levels: Codebook::Levels (2M + 1); cost: lambda * bits of symbol u, u <
// 2M + 3. A magnitude whose level is not above the one below it is never
// chosen.
void LloydThresholds(const float* levels, uint32_t M, const float* cost, float* thr);

// out[r * n + c] = table[at[c] + r] for r < rows, c < n: per-channel rows of
// values that channels share (LloydThresholds of each channel's codebook and
// rate term), spread to one row per value for the row kernel.
void GatherRows(const float* table, const int32_t* at, uint32_t n, uint32_t rows, float* out);

// q[c]: the chosen symbol's signed value (the plain rounding where that is
// beyond M + 1); rec[c] = pred + level * st; level[c]: the level it
// reconstructs at, in steps (q itself beyond M).
void LloydRow(const LloydRowInput& in, int32_t* q, float* rec, float* level);

// The scalar form (the reference; tests compare the AVX2 one with it).
void LloydRowScalar(const LloydRowInput& in, int32_t* q, float* rec, float* level);

}  // namespace cachegen
