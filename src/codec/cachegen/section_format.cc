#include "codec/cachegen/section_format.h"

#include <array>

#include "codec/cachegen/section_coder.h"

namespace cachegen {

void ChannelCodes(double mean, double var, uint8_t* sigma_code, int32_t* mean_code) {
  *sigma_code = SigmaCode(std::sqrt(std::max(0.0, var)));
  const float unit = SigmaFromCode(*sigma_code) / kMeanUnitsPerSigma;
  *mean_code = static_cast<int32_t>(std::clamp(std::nearbyint(mean / unit), -kMaxAbsSymbol, kMaxAbsSymbol));
}

float MeanFromCode(int32_t mean_code, float sigma) { return static_cast<float>(mean_code) * (sigma / kMeanUnitsPerSigma); }

void Codebook::Levels(uint32_t group, uint32_t kind, float* y) const {
  const int8_t* o = &offsets[(size_t{group} * kinds + kind) * 2 * levels];
  y[0] = 0;
  for (uint32_t u = 1; u <= 2 * levels; ++u) y[u] = static_cast<float>(UnZigZag(u)) + float(o[u - 1]) * kCodebookUnit;
}

void Codebook::AllLevels(uint32_t channels, float* y) const {
  for (uint32_t g = 0; g < groups(channels); ++g)
    for (uint32_t k = 0; k < kinds; ++k) Levels(g, k, y + LevelOffset(k, g * group_channels));
}

size_t Codebook::bytes(uint32_t channels) const {
  if (!levels) return 0;
  size_t varint = 1;
  for (uint32_t g = group_channels; g >= 0x80; g >>= 7) ++varint;
  return 1 + varint + size_t{groups(channels)} * kinds * 2 * levels;
}

const std::array<float, 256>& SigmaTable() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = SigmaFromCode(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

}  // namespace cachegen
