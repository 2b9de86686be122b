// Model profiles without being asked for: the first time cachegen meets a
// model without a profile (eval, slot compress --model, llama-serve), it
// learns one from text the model writes itself, so that no user text is
// needed and no text an eval scores is ever learned from, and keeps it in a
// cache folder under the model's fingerprint, where later runs read it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cachegen/llama_engine.h"
#include "cachegen/profile.h"
#include "cachegen/status.h"
#include "codec/cachegen/profile_cache.h"

namespace cachegen::engine {

struct AutoProfileOptions {
  std::string model_path;
  // The model already loaded from model_path, and its ModelFingerprint, when
  // the caller has them (a server): not loaded or hashed again. Null / empty:
  // loaded and computed here.
  std::shared_ptr<LlamaModel> model;
  std::string fingerprint;
  std::string cache_dir;  // empty: DefaultProfileCacheDir() (codec/cachegen/profile_cache.h)
  uint32_t threads = 0;   // llama.cpp threads (0: its default)
  // The cache the profile is for (ModelProfileOptions): other types than
  // f16/f16 are part of the file's name (CacheTypesTag).
  LlamaCacheTypes cache;
  // What it is learned from: windows of context + continuation tokens the
  // model samples. Other values than these defaults (tests: smaller, faster)
  // are part of the cache file's name, so such profiles are kept apart.
  uint32_t windows = 8, context = 384, continuation = 128;
  std::function<void(const std::string&)> progress;  // one line per step; may be empty
};

struct AutoProfile {
  std::shared_ptr<const Profile> profile;
  std::string path;                        // its file in the cache folder
  bool learned = false;                    // learned now (else read from the cache)
  double seconds = 0;                      // spent learning or reading
  // For the user: where it came from, e.g. "learned in 41.0 s from 8 windows
  // of text the model wrote itself (kept in PATH)".
  std::string source;
};

// How automatic profiles are learned (part of their file names and store
// keys: profiles learned otherwise are other profiles).
inline constexpr const char* kAutoProfileSettings = "auto3";

// The model's automatic profile from the cache folder only: kNotFound when
// it has none (or none valid for the model) yet.
Result<AutoProfile> CachedModelProfile(const AutoProfileOptions& options);

// The model's automatic profile: read from the cache folder when there (and
// valid for the model), else learned (lloyd quantizer, RoPE undone, as
// `profile train` with its defaults, on 8 windows of 384 + 128 tokens the
// model samples itself) and written there atomically. A cache folder that
// cannot be written costs only the saving (said in `source`).
Result<AutoProfile> AutoModelProfile(const AutoProfileOptions& options);

// The best quality level's KL target when none is given (llama-serve and
// its benchmarks): half the KL of an 8-bit cache on this model
// (SensitivityCurve::q8_kl, measured when the profile was learned), so that
// the best level is at least as faithful as llama.cpp's q8_0 cache with room
// for the prediction's error (docs/EVAL.md); 0 when the profile did not
// measure it (callers keep their bits default).
double DefaultBestLevelKl(const Profile& profile);

// `count` token windows of `length` tokens that the model writes itself:
// BOS, then tokens sampled at temperature 1 from a generator seeded with
// `seed` (an end-of-text token starts a new document with BOS).
Result<std::vector<std::vector<int32_t>>> SampleModelWindows(const std::shared_ptr<LlamaModel>& model,
                                                            uint32_t count, uint32_t length, uint64_t seed,
                                                            uint32_t threads = 0);

}  // namespace cachegen::engine
