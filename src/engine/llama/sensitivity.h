// Model-measured sensitivity of each KV section (layer, K|V): how much the
// model's next-token distributions move per unit of quantization in that
// section alone. `cachegen profile train` stores the result in the profile
// (Profile::WithSensitivity), and rate control allocates steps by it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/llama_engine.h"
#include "cachegen/profile.h"
#include "cachegen/status.h"

namespace cachegen::engine {

struct SensitivityOptions {
  uint32_t context = 384, continuation = 128;  // each window: N context + M scored tokens (+1)
  // Section steps (units of the profile's channel scales) each section is
  // quantized at, rising. Those up to 1 fit the weights (the high-rate
  // range); all of them make the profile's curve, from which the encoder
  // predicts KL: the coarser ones cover the low rates (on docs6L a KL target
  // of 1e-3 puts key sections at steps near 10).
  std::vector<double> steps = {0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0};
  // Multipliers m at which every section is quantized at once, at m times
  // its step factor (as a KL target codes them), to calibrate the sum of the
  // sections' curves against the joint effect; rising, at most 16, may be empty.
  std::vector<double> joint_multipliers = {0.25, 1.0, 4.0, 16.0};
  uint32_t threads = 0;  // llama.cpp threads (0: its default)
  // The cache the KV is captured from and injected into (LlamaContextOptions).
  LlamaCacheTypes cache;
  std::function<void(const std::string&)> progress;  // may be empty
};

struct SensitivityReport {
  std::vector<double> steps;
  // [section][step]: mean KL(exact || quantized) over the scored positions of
  // every window, with only that section quantized (the codec's quantizer and
  // the profile's statistics, as a frame with the profile codes it).
  std::vector<std::vector<double>> kl;
  // Per section: KL per squared step, geometric mean of kl / step^2 over the
  // steps up to 1 (all of them when none is) (the high-rate model KL ≈ w
  // step^2, fitted in relative terms).
  std::vector<float> weights;
  // Per joint multiplier: the mean KL with every section quantized at m
  // times its step factor (internal::ProfileData::StepFactors of weights).
  std::vector<double> joint_multipliers, joint_kl;
  // The mean KL of an 8-bit cache (SensitivityCurve::q8_kl) and which one:
  // llama.cpp's q8_0 cache where the model runs it, else the q8 codec.
  double q8_kl = 0;
  std::string q8_source;
};

// Measures every section of `model` on `windows` (token windows of at least
// context + continuation + 1 tokens, position 0 first). `config` supplies the
// quantizer kind; rope, rotation and group size come from the profile.
Result<SensitivityReport> MeasureSensitivity(const std::shared_ptr<LlamaModel>& model,
                                             std::span<const std::vector<int32_t>> windows, const Profile& profile,
                                             const CodecConfig& config, const SensitivityOptions& options);

}  // namespace cachegen::engine
