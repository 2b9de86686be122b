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

// Frame parameters (FORMAT.md "Frame parameters"): versions and flags.
constexpr uint8_t kParamsVersion1 = 1;
constexpr uint8_t kParamsVersion2 = 2;
constexpr uint8_t kParamsRotate = 1;   // Hadamard-rotated heads
constexpr uint8_t kParamsRope = 2;     // keys post-RoPE: a RoPE block follows (version 2)
constexpr uint8_t kParamsProfile = 4;  // a model profile id follows (version 2)
constexpr uint8_t kParamsFlagsKnown = 7;

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

// What a section asks of a decoder schedule, beyond the plain path (anchor
// rows, or anchor and delta rows, uniform levels, f16/bf16/f32 rows with
// contiguous dims): each schedule declares below which of these it takes, and
// a section asking for anything else goes to the generic schedule, which
// takes every valid section (the reference, section_decoder.cc).
enum SectionFeature : uint32_t {
  kFeatureProfileStats = 1u << 0,   // channel statistics from a model profile
  kFeatureProfileTables = 1u << 1,  // table-form streams, one table per head
  kFeatureChannelClasses = 1u << 2, // table-form streams, a table cycle per head (classes)
  kFeatureCodebook = 1u << 3,       // reconstruction codebook
  kFeatureHeadTransform = 1u << 4,  // a profile's learned head transforms
  kFeatureHadamard = 1u << 5,       // Hadamard-rotated heads
  kFeatureRope = 1u << 6,           // keys with RoPE redone
  kFeatureRopeSplitPairs = 1u << 7, // RoPE pairs across 8-dim blocks (no transform)
  kFeatureOddHeadDim = 1u << 8,     // head_dim not a multiple of 8
  kFeatureSingleTokenGroups = 1u << 9,  // delta prediction with groups of 1 token (none)
  kFeatureStridedDims = 1u << 10,   // output rows whose dims are not contiguous
  kFeatureOneLaneStreams = 1u << 11,  // rANS streams of other than 8 lanes, constant or empty streams
  kFeatureExactTail = 1u << 12,     // recent tokens kept as exact f16
  kFeatureFinerRecent = 1u << 13,   // a finer step for the recent tokens
};

struct DecodeSchedule {
  const char* name;
  uint32_t takes;  // SectionFeature bits
};
// The generic CPU schedule: every section the format defines.
constexpr DecodeSchedule kGenericSchedule{"generic", ~0u};
// The fused AVX2 schedule (fused_decode.h): the default quality path.
constexpr DecodeSchedule kFusedSchedule{
    "fused-avx2", kFeatureProfileStats | kFeatureProfileTables | kFeatureChannelClasses | kFeatureCodebook |
                      kFeatureHeadTransform | kFeatureRope | kFeatureExactTail | kFeatureFinerRecent};
// The CUDA warp schedule (gpu_core.h, planned by gpu_plan.h): every feature
// but strided dims (its output layouts have contiguous dims).
constexpr DecodeSchedule kCudaSchedule{"cuda-warp", ~uint32_t{kFeatureStridedDims}};
constexpr bool Takes(const DecodeSchedule& s, uint32_t features) { return (features & ~s.takes) == 0; }

}  // namespace cachegen
