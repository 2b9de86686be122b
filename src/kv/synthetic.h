// Synthetic KV caches with the structure real LLM caches show, for tests,
// benchmarks and the demo when no model dump is at hand.
//
// Keys: per-channel means and scales with a few outlier channels per head
// (large magnitude, nonzero mean), token-to-token correlation as an AR(1)
// process per channel (rho drawn per channel), then rotary position embedding
// (RoPE, "rotate half" pairing (i, i + D/2), base 10000) by absolute position.
// Values: per-token scale times per-channel scale, weaker AR(1) correlation.
// Every layer has its own overall scale.
//
// Deterministic for a seed: it uses std::mt19937_64 (whose output the
// standard fixes) and its own normal sampler, not std::normal_distribution
// (whose algorithm is implementation-defined). The only platform dependence
// left is libm's last-ulp rounding of log/sin/cos/pow/exp.
#pragma once

#include <cstdint>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen {

struct SyntheticOptions {
  uint32_t outlier_channels_per_head = 2;  // key channels with large magnitude
  double outlier_scale = 8.0;              // their scale relative to normal channels
  double key_rho_min = 0.80, key_rho_max = 0.95;      // AR(1) coefficient range of keys
  double value_rho_min = 0.20, value_rho_max = 0.50;  // ... of values
  bool rope = true;
  double rope_base = 10000.0;
  uint32_t token_start = 0;  // absolute position of token 0 (for RoPE)
};

// A tensor of `shape` in `dtype`. InvalidArgument for a shape that fails
// KVShape::Validate or odd head_dim with rope on.
Result<KVTensor> SyntheticKV(const KVShape& shape, DType dtype, uint64_t seed, const SyntheticOptions& options = {});

}  // namespace cachegen
