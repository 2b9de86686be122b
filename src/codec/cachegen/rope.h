// RoPE-aware keys for the `cachegen` codec: llama.cpp-style engines cache keys
// after the rotary position embedding, which spins each key's channel pairs by
// its position, so per-channel statistics see rotation as variance. The
// encoder undoes the rotation (position of chunk token t = token_start + t)
// and the decoder redoes it on the reconstructed keys (docs/FORMAT.md,
// "RoPE block").
//
// Conventions of ggml_rope_ext without YaRN: pair i of the first `dims` dims of
// a head turns by theta = pos * freq_scale * freq_base^(-2i/dims); "normal"
// rotates dims (2i, 2i+1), "neox" rotates (i, i + dims/2). Dims past `dims`
// are untouched. The angle table is computed in double and rounded to f32; the
// rotation itself is f32 arithmetic exactly as written in FORMAT.md.
#pragma once

#include <cstdint>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/status.h"

namespace cachegen {

// Checks kind/dims/frequencies against a head dim (kind kNone is valid).
Status ValidateRope(const RopeConfig& rope, uint32_t head_dim);

// cos/sin of every (token, pair) of one frame.
class RopeTable {
 public:
  RopeTable(const RopeConfig& rope, uint32_t token_start, uint32_t tokens);
  const RopeConfig& rope() const { return rope_; }
  uint32_t token_start() const { return token_start_; }
  uint32_t tokens() const { return tokens_; }
  uint32_t pairs() const { return pairs_; }
  // cos and sin of (token t, pair i) at [t * pairs() + i] (the CUDA decoder uploads them).
  const std::vector<float>& cos() const { return cos_; }
  const std::vector<float>& sin() const { return sin_; }
  // Rotates one head vector of chunk token t: forward (decoder) or inverse (encoder).
  void Apply(uint32_t t, float* head, bool inverse) const;
  // The rows of tokens [token_start, token_start + tokens) of `whole` (a
  // table from position 0 covering them): the values computed directly.
  RopeTable(const RopeTable& whole, uint32_t token_start, uint32_t tokens);

 private:
  RopeConfig rope_;
  uint32_t token_start_ = 0, tokens_ = 0, pairs_ = 0;
  std::vector<float> cos_, sin_;
};

// The table for a frame, cached per thread (every K section of a frame uses
// the same one), cut from a per-thread table of positions from 0 where the
// frame's positions lie below kRopeCachePositions (frames of every context
// share positions, so the angles are computed once per thread).
constexpr uint32_t kRopeCachePositions = 1u << 15;
const RopeTable& CachedRopeTable(const RopeConfig& rope, uint32_t token_start, uint32_t tokens);

}  // namespace cachegen
