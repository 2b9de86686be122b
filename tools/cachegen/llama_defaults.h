// Defaults of the llama.cpp commands (eval, llama-serve, bench-ttft): the
// shared trained model and text when the checkout sits next to them, and
// otherwise something that still runs.
#pragma once

#include <string>

#include "cachegen/codec.h"
#include "cachegen/status.h"
#include "engine/llama/auto_profile.h"

#include "cachegen/cli.h"

namespace cachegen::cli {

inline constexpr const char* kSharedModel = "../shared/models/stories260K.gguf";
inline constexpr const char* kSharedText = "../shared/data/tinystories/dev.txt";

// kSharedModel when it exists. Otherwise a random-weight tiny model (written
// once, at a fixed path in the temp directory, so that chunk keys rooted in
// the model file stay valid across runs); then `*note` (when given) says so,
// and the same line goes to stderr prefixed by "cachegen <tool>: ".
Result<std::string> DefaultModelPath(const std::string& tool, std::string* note = nullptr);

// docs6L and its domain's text (../shared): production-shaped heads (dim 64).
inline constexpr const char* kDocsModel = "../shared/models/docs6L.gguf";
inline constexpr const char* kDocsText = "../shared/data/docs/dev.txt";

// A random-weight Llama-3.2-1B-shaped model with `weights` (f16, q8_0, q4_0,
// q4_k_m), written once to the temp directory (said on stderr as "<tool>: ...").
Result<std::string> RandomLlama1BPath(const std::string& tool, const std::string& weights = "f16");

// The text of `path`; with none, kSharedText's when it exists, else a
// built-in story repeated to about 40 KB (said on stderr as for the model).
// `source`, when given, receives the file read or "built-in".
Result<std::string> TextOrDefault(const std::string& tool, const std::string& path, std::string* source = nullptr);

// A llama.cpp command's model (DefaultModelPath when `model` is empty),
// loaded, and its text (TextOrDefault).
struct ModelAndText {
  std::string model_path;
  std::shared_ptr<LlamaModel> model;
  std::string text, text_source;
};
Result<ModelAndText> LoadModelAndText(const std::string& tool, const std::string& model, const std::string& text);

// The model's automatic profile for a cache of `types`
// (engine::AutoModelProfile, in the default cache folder), progress and
// where it came from on stderr prefixed by "cachegen <tool>: " unless quiet.
Result<engine::AutoProfile> AutoProfileFor(const std::string& tool, const std::string& model_path, uint32_t threads,
                                           bool quiet, const LlamaCacheTypes& types = {});

// What llama-serve codes chunks with when given no codec options: the
// model's automatic profile (AutoProfileFor), 4 levels, the best at
// `best_kl` (> 0) or engine::DefaultBestLevelKl. Sets `codec` and, when
// given, `coding` to a line saying so.
Status UseServeDefaultCoding(const std::string& tool, const std::string& model_path, uint32_t threads, double best_kl,
                             CodecConfig* codec, std::string* coding = nullptr, const LlamaCacheTypes& types = {});

}  // namespace cachegen::cli
