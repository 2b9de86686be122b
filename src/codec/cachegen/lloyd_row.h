// The lloyd quantizer's per-value choice (FORMAT.md, cachegen "Encoder
// choices"): for the channels of one row that share a codebook, the level
// that minimises distortion plus lambda * bits among the rounded magnitude
// and its two neighbours. The encoder runs it on every row of every pass of
// codebook learning and on the final quantization, so it has an AVX2 form;
// both forms give the same symbols and reconstructions bit for bit.
#pragma once

#include <cstdint>

namespace cachegen {

struct LloydRowInput {
  const float* row;   // values
  const float* pred;  // their predictions (channel means or the group's anchor)
  const float* st;    // steps
  const float* inv;   // 1 / steps
  uint32_t n = 0;     // channels
  // The channels' codebook: levels[u], u = 0..2M (Codebook::Levels), M <= 16.
  const float* levels = nullptr;
  uint32_t M = 0;
  // Lambda * bits of symbol u, u < 2M + 3, of channel c: cost[cost_at[c] + u].
  const float* cost = nullptr;
  const int32_t* cost_at = nullptr;
};

// q[c]: the chosen symbol's signed value; rec[c] = pred + level * st; level[c]:
// the level it reconstructs at, in steps (q itself beyond M).
void LloydRow(const LloydRowInput& in, int32_t* q, float* rec, float* level);

// The scalar form (the reference; tests compare the AVX2 one with it).
void LloydRowScalar(const LloydRowInput& in, int32_t* q, float* rec, float* level);

}  // namespace cachegen
