#include "engine/rope.h"

#include <cmath>
#include <string>
#include <vector>

namespace cachegen::engine {

Status RotateKeys(const KVView& kv, std::span<const int32_t> positions, const RopeSpec& rope, bool inverse) {
  const KVShape& s = kv.shape();
  if (positions.size() != s.tokens) {
    return Status::InvalidArgument("rope: " + std::to_string(positions.size()) + " positions for " +
                                   std::to_string(s.tokens) + " tokens");
  }
  if (rope.dims == 0 || rope.dims % 2 != 0 || rope.dims > s.head_dim) {
    return Status::InvalidArgument("rope: " + std::to_string(rope.dims) + " rotated dims do not fit head dim " +
                                   std::to_string(s.head_dim));
  }
  if (!(rope.freq_base > 0) || !std::isfinite(rope.freq_scale)) {
    return Status::InvalidArgument("rope: bad frequency parameters");
  }
  const uint32_t pairs = rope.dims / 2;
  std::vector<double> inv_freq(pairs);
  for (uint32_t i = 0; i < pairs; ++i) {
    inv_freq[i] = rope.freq_scale * std::pow(rope.freq_base, -2.0 * i / rope.dims);
  }
  const uint64_t C = s.channels();
  std::vector<float> row(C);
  std::vector<double> cs(pairs), sn(pairs);
  for (uint32_t t = 0; t < s.tokens; ++t) {
    for (uint32_t i = 0; i < pairs; ++i) {
      const double th = positions[t] * inv_freq[i];
      cs[i] = std::cos(th);
      sn[i] = inverse ? -std::sin(th) : std::sin(th);
    }
    for (uint32_t l = 0; l < s.layers; ++l) {
      kv.ReadRow(l, KV::kKey, t, row.data());
      for (uint32_t h = 0; h < s.kv_heads; ++h) {
        float* x = row.data() + uint64_t{h} * s.head_dim;
        for (uint32_t i = 0; i < pairs; ++i) {
          const uint32_t a = rope.neox ? i : 2 * i;
          const uint32_t b = rope.neox ? i + pairs : 2 * i + 1;
          const double x0 = x[a], x1 = x[b];
          x[a] = static_cast<float>(x0 * cs[i] - x1 * sn[i]);
          x[b] = static_cast<float>(x0 * sn[i] + x1 * cs[i]);
        }
      }
      kv.WriteRow(l, KV::kKey, t, row.data());
    }
  }
  return Status::Ok();
}

}  // namespace cachegen::engine
