// Learning a model profile (cachegen/profile.h) from a llama.cpp model's own
// KV cache: what `cachegen profile train` runs, and `cachegen demo` before
// it compares the default codec with and without a profile.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/profile.h"
#include "cachegen/status.h"
#include "engine/llama/sensitivity.h"

namespace cachegen::engine {

inline constexpr uint32_t kValueCodingMinHeadDim = 32;

struct ModelProfileOptions {
  std::string model_path;
  std::shared_ptr<LlamaModel> model;  // model_path already loaded, or null (loaded here)
  std::string text;  // stories separated by lines "<|endoftext|>"
  // Token windows to learn from instead of `text` (each at least context +
  // continuation + 1 tokens, position 0 first); `skip` applies to them too.
  std::vector<std::vector<int32_t>> windows;
  // Windows are cut as RunEval cuts them (context + continuation + 1 tokens),
  // so that skip = W skips exactly the text an eval of W windows scores; the
  // next `contexts` windows are learned from (fewer where the text ends).
  uint32_t contexts = 8, context = 384, continuation = 128, skip = 0, threads = 0;
  bool rope = true;             // keys with the model's RoPE undone (as the codec codes them)
  bool sensitivity = true;      // measure and store each section's sensitivity (slow: most of the time)
  bool channel_weights = true;  // K channel weights from the model's attention (not with tuning.rotate)
  bool key_transform = true;
  bool channel_classes = true;
  // V sections too: a learned transform of each V head and channel weights
  // from the model's attention and output matrix (unset: on for heads of at
  // least kValueCodingMinHeadDim dims: on docs6L, head dim 64, together they
  // cut the bits at q8_0's KL by 13 % and at q4_0's by 21 %; on stories260K,
  // head dim 8, they cost 2 %: docs/results/eval.md), and tables per channel class.
  std::optional<bool> value_transform, value_channel_weights;
  bool value_channel_classes = false;
  double channel_weight_strength = 0;  // ProfileTrainOptions::channel_weight_strength (0: the measured default)
  std::vector<double> sensitivity_steps = SensitivityOptions().steps;
  CodecConfig tuning;  // the quantizer, group size and rotation the profile is learned for
  // The llama.cpp cache the KV is captured from (LlamaContextOptions, in the
  // model's basis): a quantized cache's KV is its dequantized values.
  LlamaCacheTypes cache;
  // One line per step and per part skipped (with the reason); may be empty.
  std::function<void(const std::string&)> progress;
};

struct ModelProfile {
  std::shared_ptr<const Profile> profile;
  uint32_t contexts = 0;         // windows learned from
  bool channel_weights = false;  // used (the options ask; the model and tuning allow)
  std::optional<SensitivityReport> sensitivity;
};

// Fails when the text has no whole window after the skipped ones.
Result<ModelProfile> TrainModelProfile(const ModelProfileOptions& options);

}  // namespace cachegen::engine
