// The cachegen section format's constants and value codes in one place
// (docs/FORMAT.md "Section payload"): the encoder, every decoder schedule
// (generic, fused AVX2, the CUDA jobs of gpu_core.h) and the GPU planner take
// them from here. Host and device (CG_HD) where the CUDA jobs use them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/hd.h"

namespace cachegen {

// Section flags (FORMAT.md "Section payload").
constexpr uint8_t kSectionDelta = 1;
constexpr uint8_t kSectionProfileStats = 2;   // channel statistics from the profile
constexpr uint8_t kSectionProfileTables = 4;  // streams in table form, grid point byte follows the step
constexpr uint8_t kSectionCodebook = 8;       // reconstruction codebook after the channel statistics
constexpr uint8_t kSectionFlagsKnown = 15;

// Channel scales are stored as u8 codes on a 1/8-octave grid: 2^((code-128)/8),
// 2^-16 .. 2^15.9. Coarse is fine: rate control scales every step anyway.
constexpr int kSigmaCodeBias = 128;
constexpr float kSigmaCodeSteps = 8.0f;
// Means are stored as integers in units of scale/4: the encoder uses the
// stored value, so its coarseness only costs a negligible offset.
constexpr float kMeanUnitsPerSigma = 4.0f;
// Quantized values are kept within +-2^30 so symbols fit 32 bits.
constexpr double kMaxAbsSymbol = double(1 << 30);

inline float SigmaFromCode(uint8_t code) { return std::exp2((int(code) - kSigmaCodeBias) / kSigmaCodeSteps); }

inline uint8_t SigmaCode(double sigma) {
  if (!(sigma > 0)) return 0;
  const double c = std::nearbyint(std::log2(sigma) * kSigmaCodeSteps) + kSigmaCodeBias;
  return static_cast<uint8_t>(std::clamp(c, 0.0, 255.0));
}

// Reconstruction codebooks (FORMAT.md): offsets in 1/128 of a step, at most
// 16 magnitudes.
constexpr float kCodebookUnit = 1.0f / 128;
constexpr uint32_t kMaxCodebookLevels = 16;

CG_HD inline uint32_t ZigZag(int32_t q) { return (static_cast<uint32_t>(q) << 1) ^ static_cast<uint32_t>(q >> 31); }
CG_HD inline int32_t UnZigZag(uint32_t u) { return static_cast<int32_t>(u >> 1) ^ -static_cast<int32_t>(u & 1); }

// Rounds half away from zero. Only the encoder rounds, so the rounding rule is
// not part of the format; this form vectorizes, nearbyint does not.
inline int32_t QuantizeValue(float r, float inv_step) {
  // min/max rather than std::clamp: same values for finite input, and branch-free.
  const float v = std::min(std::max(r * inv_step, -float(kMaxAbsSymbol)), float(kMaxAbsSymbol));
  return static_cast<int32_t>(v + std::copysign(0.5f, v));
}

}  // namespace cachegen
