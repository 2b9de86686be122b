// Model profiles (.cgprof): side information of the `cachegen` codec learned
// offline from a few contexts of one model — per-channel statistics (scale and
// mean of every layer's K and V channels) and rANS frequency tables per
// (layer, K|V, head, anchor|delta stream) on a grid of quantizer steps,
// optionally a learned per-head transform of the keys, and optionally the
// model's sensitivity per section (encoder guidance only).
// Frames encoded with a profile reference it by its 64-bit id and carry
// neither (docs/FORMAT.md, ".cgprof" and "Profile reference"); decoding them
// needs the same profile, given to the decoder in a ProfileSet (as zstd is
// given a dictionary): nothing is registered process-wide.
//
// Thread safety: a Profile is immutable; a ProfileSet is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/status.h"

namespace cachegen {

namespace internal {
struct ProfileData;
}

// What Profile::Train learns beyond channel statistics and tables.
struct ProfileTrainOptions {
  // Learn, per K head, the orthonormal transform that decorrelates its
  // channels (the eigenvectors of their covariance, KLT); frames then code
  // keys in that basis and decoders turn them back (docs/FORMAT.md, format
  // version 3). Measured on stories260K (docs/results/eval.md). Not with rotate
  // (ignored there).
  bool key_transform = true;
  // Per section (layer l: 2l = K, 2l + 1 = V): empty, or per KV head a
  // symmetric positive semidefinite D x D matrix M ([head][r][c], coding
  // domain before any learned transform): a coding error e of that head
  // costs e^T M e (e.g. from the model's attention,
  // src/engine/llama/channel_weights.h). Each coded channel c then weighs
  // w_c = (U^T M U)_cc (M_cc without a transform), and within each head the
  // section's channel scales move from the measured σ towards ∝ 1/sqrt(w_c)
  // (in log, by channel_weight_strength of the way), the head keeping its
  // geometric-mean scale, so frames' steps put bits where they count. Not
  // with rotate.
  std::vector<std::vector<double>> channel_weights;
  // The fraction of that move, in (0, 1]; 0 = the measured default: the whole
  // way in a section with a key transform, half-way without (docs/results/eval.md).
  double channel_weight_strength = 0;
  // Code K sections' symbols with one table per class of channels instead of
  // one per head (docs/FORMAT.md, format version 4): channels are classed by
  // the spread of their quantizer inputs against their coded scale, in
  // quarter octaves (at most 16 classes per stream kind), so channels whose
  // symbols are distributed alike share a table. Measured on stories260K
  // (docs/results/eval.md).
  bool key_channel_classes = true;
  // The same for V sections: a learned transform of each V head, and tables
  // per class of alike channels (the format allows either in any section).
  bool value_transform = false;
  bool value_channel_classes = false;
};

// What a model's measured sensitivity curve holds (Profile::WithSensitivity).
struct SensitivityCurve {
  // Rising section steps (2 to 16 of them; empty: no curve) and, per section
  // (row), the mean KL with that section alone quantized at each.
  std::vector<float> steps, kl;
  // The mean KL of an 8-bit cache on the same windows: llama.cpp's q8_0
  // cache type where the model runs it, else every section coded by the q8
  // codec; what "as faithful as an 8-bit cache" means on this model (0 = not
  // measured).
  float q8_kl = 0;
  // The joint calibration (may be empty): at rising predictions (the sum of
  // the sections' curves at the steps of a KL target), the mean KL measured
  // with every section quantized at once. The encoder scales its predicted
  // sum by the measured / predicted ratio there (log-log interpolated).
  std::vector<float> joint_predicted, joint_measured;
};

class Profile {
 public:
  // Validates a .cgprof (untrusted bytes: every field is checked, the
  // checksum must match).
  static Result<std::shared_ptr<const Profile>> Parse(std::span<const uint8_t> bytes);

  // Learns a profile from whole contexts of one model (tokens at positions
  // 0..T-1, keys as cached). The coding domain follows `config`: its rope and
  // rotate settings (frames using the profile must be encoded with the same)
  // and its group size (for the delta tables); `options` says what else to
  // learn.
  static Result<std::shared_ptr<const Profile>> Train(std::span<const KVView> contexts, const CodecConfig& config,
                                                      const ProfileTrainOptions& options = {});

  // A copy that also holds the model's measured sensitivity of every section
  // (layer l: 2l = K, 2l + 1 = V): mean KL of the next-token distributions per
  // unit of squared section step, finite and in [1e-30, 1e30]. The encoder's
  // rate control then allocates steps by them (docs/FORMAT.md ".cgprof").
  // Optionally also the measured curve, from which the encoder predicts KL
  // at any step, and the q8 reference KL (format version 5). The copy has
  // another id.
  Result<std::shared_ptr<const Profile>> WithSensitivity(std::span<const float> per_section,
                                                         const SensitivityCurve& curve = {}) const;

  uint64_t id() const;  // XXH3-64 of the file before its checksum (the checksum itself)
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  uint32_t layers() const;
  uint32_t kv_heads() const;
  uint32_t head_dim() const;
  // The quantizer the tables were learned for (an encoder using the other one
  // is refused); nullopt for versions 1 and 2, which do not record it.
  std::optional<CodecConfig::Quantizer> quantizer() const;
  const internal::ProfileData& data() const { return *data_; }

 private:
  Profile() = default;
  std::vector<uint8_t> bytes_;
  std::shared_ptr<const internal::ProfileData> data_;
};

// The model profiles a decode may use, found by the id a frame references.
// Passed explicitly to every decode (DecodeFrame, Decoder::Open,
// StreamOptions::profiles); a frame whose profile is not in the set, or
// given no set, fails with kNotFound naming the profile's id. A set may hold
// profiles of several models (a store shared by them); a server that learns
// a profile while it runs adds it to the set its decodes use.
class ProfileSet {
 public:
  ProfileSet() = default;
  explicit ProfileSet(std::shared_ptr<const Profile> profile) { Add(std::move(profile)); }
  ProfileSet(const ProfileSet&) = delete;
  ProfileSet& operator=(const ProfileSet&) = delete;

  // Adds `profile` (null is ignored; the same id again is a no-op).
  void Add(std::shared_ptr<const Profile> profile);
  // The profile with this id, or null.
  std::shared_ptr<const Profile> Find(uint64_t id) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<const Profile>> by_id_;
};

}  // namespace cachegen
