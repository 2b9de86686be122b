// Rate control of the cachegen codec: the step of every section of a chunk
// at one quality level for the configured target -- bits per value (a
// sampled secant search, then full-data corrections), reconstruction SNR,
// max error, or predicted KL (a model profile's sensitivities) -- the levels
// of one chunk sharing what the search learned (RateMemo).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cachegen/status.h"
#include "codec/cachegen/section_coder.h"
#include "codec/codec.h"

namespace cachegen {

namespace internal {
struct ProfileData;
}

// One chunk's section analyses, section i = layer i / 2, K when i is even.
using SectionAnalyses = std::vector<std::optional<SectionAnalysis>>;

// What the bits-mode rate control of one chunk carries from level to level:
// the delta choices (made at the unit step, so the same for every level),
// the sampled size estimates it evaluated (log2 step, bits per value) and
// the ratio of the sampled estimate to the full-data size last seen.
struct RateMemo {
  std::vector<uint8_t> deltas;
  std::vector<std::pair<double, double>> sampled;
  double bias = 1;
};

// Fills q with level `level`'s full-data quantization of every section (the
// one that is coded); spare is scratch of the same size. memo starts empty
// for a chunk and is passed to its levels in order.
Status ChooseSteps(const SectionAnalyses& a, const KVShape& s, const CodecConfig& cfg, uint32_t level, RateMemo* memo,
                   std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare);

// Sum over sections of each one's predicted KL at its step (the sections'
// effects add up at small errors), scaled by the profile's joint
// calibration; -1 without sensitivities.
double PredictedKl(const internal::ProfileData& d, const std::vector<QuantizedSection>& q);

}  // namespace cachegen
