// Rotary position embedding on captured keys: undo it before encoding (so keys
// of nearby tokens look alike again) and redo it after decoding.
//
// Conventions of ggml_rope_ext without YaRN (ext_factor 0): for pair i of the
// first `dims` dims of a head, theta = pos * freq_scale * freq_base^(-2i/dims);
// "normal" rotates dims (2i, 2i+1), "neox" rotates (i, i + dims/2). Dims past
// `dims` are untouched. Computed in double; the result is rounded to the
// view's dtype, so undo+redo on an f16 view is not exact — apply it to an f32
// copy.
#pragma once

#include <cstdint>
#include <span>

#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen::engine {

struct RopeSpec {
  bool neox = false;
  uint32_t dims = 0;  // rotated dims per head; 0 or > head_dim is kInvalidArgument
  double freq_base = 10000.0;
  double freq_scale = 1.0;
};

// Rotates every key of `kv` (V is untouched) by +theta (inverse = false) or
// -theta (inverse = true); positions: one per token.
Status RotateKeys(const KVView& kv, std::span<const int32_t> positions, const RopeSpec& rope, bool inverse);

}  // namespace cachegen::engine
