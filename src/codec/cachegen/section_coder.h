// The cachegen codec's per-section coder: one (layer, K|V) of one chunk.
//
// Pipeline (docs/FORMAT.md, "The cachegen codec"): optional per-head Hadamard rotation
// or learned transform (a profile's, head_transform.h),
// per-channel mean and scale, token groups of G whose first token (anchor) is
// quantized against the channel mean and whose other tokens are quantized as
// deltas against the *reconstructed* anchor (closed loop: no drift, groups are
// independent), uniform per-channel steps = scale * section step, and rANS per
// head for anchors and deltas. The context's most recent tokens may use a
// finer step, or be kept exactly (f16).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cachegen/codec.h"
#include "cachegen/kv.h"
#include "cachegen/status.h"
#include "codec/rans.h"
#include "codec/cachegen/section_format.h"
#include "common/bytes.h"

namespace cachegen {

namespace internal {
struct ProfileData;
}

// Default prediction group (see cachegen_codec.cc).
constexpr uint32_t kCacheGenDefaultGroupTokens = 2;

// The stored codes of one channel's scale and mean (FORMAT.md "Section payload").
void ChannelCodes(double mean, double var, uint8_t* sigma_code, int32_t* mean_code);
// The mean a mean code stands for, given the channel's dequantized scale.
float MeanFromCode(int32_t mean_code, float sigma);

struct SectionLayout {
  uint32_t tokens = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t group_tokens = 1;   // G >= 1
  bool rotate = false;         // requires head_dim a power of two
  uint32_t recent_begin = 0;   // first token (chunk-relative) of the recent window
  float recent_step_scale = 1; // 0: recent tokens stored as exact f16
  // A model profile the frame references (channel statistics and tables of
  // section `section` = 2 * layer + (V ? 1 : 0) come from it), or none.
  const internal::ProfileData* profile = nullptr;
  uint32_t section = 0;
  // Encoder only: a section whose data lies more than this many octaves from
  // the profile's statistics in some head (SectionAnalysis) is coded with its
  // own statistics and tables, still through the profile's transform.
  // 0: always the profile's (profile training measures with the statistics
  // it is learning).
  float profile_misfit_octaves = 0;
  // The profile's learned per-head transform of this section (U and U^T,
  // H x D x D each; SetProfileTransform), or null: rows are coded as U^T x.
  const float* transform = nullptr;
  const float* transform_t = nullptr;
  // Encoder only: learn a reconstruction codebook and quantize with a rate
  // term (CodecConfig::quantizer kLloyd); the decoder reads the section flag.
  bool lloyd = false;
  uint32_t channels() const { return kv_heads * head_dim; }
  // Sets transform/transform_t from the profile's section `section` (none
  // when the profile has no transform there).
  void SetProfileTransform();
  // Tokens coded through the quantizer: all but an exact f16 tail.
  uint32_t quantized_tokens() const { return recent_step_scale == 0 ? recent_begin : tokens; }
};

// Streams of a section: per head an anchor stream, then (with deltas) a delta stream.
struct StreamCounts {
  uint32_t anchors = 0;  // tokens coded against the channel mean
  uint32_t deltas = 0;   // tokens coded against their group's anchor
};
StreamCounts CountStreams(const SectionLayout& l, bool use_delta);

// The per-token step multiplier: recent tokens may be finer.
inline float TokenStep(const SectionLayout& l, float step, uint32_t t) {
  return t >= l.recent_begin ? step * l.recent_step_scale : step;
}

// A section's learned reconstruction levels (FORMAT.md "Reconstruction
// codebook"): per group of channels and stream kind, the symbols u = 1..2M
// (zigzag of q = +-1..+-M) reconstruct at q + offset/128 steps instead of q.
struct Codebook {
  uint32_t levels = 0;          // M; 0: uniform (no codebook)
  uint32_t group_channels = 1;  // consecutive channels sharing one codebook
  uint32_t kinds = 1;           // 1: anchor streams only; 2: anchor and delta
  std::vector<int8_t> offsets;  // [group][kind][u - 1], u = 1..2M
  // Encoder only: lambda * bits of symbol u per [unit][kind][u], u < 2M + 3,
  // where a channel's unit is its head, or with cost_unit ([kind][channel],
  // 2 * C entries) its class's (a profile section with channel classes).
  std::vector<float> cost;
  std::vector<uint8_t> cost_unit;
  const float* Cost(uint32_t kind, uint32_t channel, uint32_t head, uint32_t channels) const {
    const uint32_t unit = cost_unit.empty() ? head : cost_unit[size_t{kind} * channels + channel];
    return &cost[(size_t{unit} * kinds + kind) * (2 * levels + 3)];
  }
  uint32_t groups(uint32_t channels) const { return (channels + group_channels - 1) / group_channels; }
  size_t bytes(uint32_t channels) const;  // as stored
  // Reconstruction levels y[u], u = 0..2M, of (group, kind), in units of the step.
  void Levels(uint32_t group, uint32_t kind, float* y) const;
  // Every (group, kind)'s levels back to back (LevelsSize floats; what the
  // decoders dequantize with), and where channel c's levels for stream kind
  // k start in them (a delta stream takes the anchors' without delta levels).
  size_t LevelsSize(uint32_t channels) const { return size_t{groups(channels)} * kinds * (2 * size_t{levels} + 1); }
  void AllLevels(uint32_t channels, float* y) const;
  size_t LevelOffset(uint32_t kind, uint32_t channel) const {
    return (size_t{channel / group_channels} * kinds + (kind < kinds ? kind : kinds - 1)) * (2 * size_t{levels} + 1);
  }
};

// One quantization of a section at (step, use_delta): its symbol streams in
// payload order and the size they would take. Rate control keeps the
// full-data one it settles on and Encode codes it, so the data is quantized
// once for both.
struct QuantizedSection {
  float step = 0;
  bool use_delta = false;
  uint32_t sample_every = 1;  // > 1: one token group in that many (estimate only)
  Codebook cb;                // learned codebook (empty unless lloyd)
  // Streams back to back, stream s = 2 * head + (delta ? 1 : 0) in
  // [begin[s], begin[s + 1]) (delta streams empty without deltas).
  std::unique_ptr<uint32_t[]> symbols;
  size_t capacity = 0;  // symbols allocated
  std::vector<size_t> begin;
  std::vector<rans::SymbolCounts> counts;  // per stream (inline tables only)
  std::vector<rans::TableStreamCost> table_costs;  // per stream (profile tables, full data only)
  double bytes = 0;  // estimated section bytes, scaled to all groups when sampled
};

// Analysis shared by every quality level: rotated rows and channel statistics.
class SectionAnalysis {
 public:
  // `rows` must outlive the analysis (unrotated rows are not copied).
  SectionAnalysis(const SectionLayout& layout, std::span<const float> rows);
  // The layout as coded: profile null where the section's data did not fit
  // the profile (SectionLayout::profile_misfit_octaves).
  const SectionLayout& layout() const { return layout_; }
  // Sum of squares and count of the original values (for SNR targets).
  double signal_power() const { return signal_power_; }
  double mean_sigma_sq() const { return mean_sigma_sq_; }

  // Quantizes at `step` and returns the exact size the section would take.
  // sample_every > 1 quantizes one token group in that many and scales up.
  double EstimateBytes(float step, bool use_delta, uint32_t sample_every) const;
  // Chooses delta prediction or not by estimated size at `step`, on one token
  // group in `sample_every`.
  bool PreferDelta(float step, uint32_t sample_every = 1) const;
  // Mean squared error of the reconstruction at `step` (rotated domain, which
  // equals the original domain up to rounding since the rotation is orthonormal).
  double MeasureMse(float step, bool use_delta) const;

  // Quantizes at `step` (one token group in `sample_every`) into q, reusing
  // its buffers, and estimates the section's size. With `near` (a
  // quantization of the same sample and delta choice at a step within an
  // eighth of an octave), its codebook is reused instead of learning one
  // when both steps take the same profile grid point: a codebook's levels
  // are in units of the step, and rate control's later estimates and
  // corrections move the step by a few percent. near may be q.
  void QuantizeStreams(float step, bool use_delta, uint32_t sample_every, QuantizedSection* q,
                       const QuantizedSection* near = nullptr) const;
  // Writes the section payload; side_bytes receives the side-information share.
  void Encode(float step, bool use_delta, std::vector<uint8_t>* out, uint32_t* side_bytes) const;
  // The same from a full-data quantization (q.sample_every == 1).
  void Encode(const QuantizedSection& q, std::vector<uint8_t>* out, uint32_t* side_bytes) const;

  // Symbol counts per (head, anchor|delta stream) at `step`: hist[(h * 2 +
  // kind) * bins + min(symbol, bins - 1)], over one token group in
  // `sample_every` (size estimates, profile training). per_channel: per
  // channel of each stream, hist[((h * 2 + kind) * D + d) * bins + ...].
  void Histograms(float step, bool use_delta, size_t bins, std::vector<uint64_t>* hist, uint32_t sample_every = 1,
                  bool per_channel = false) const;

 private:
  struct LloydStats;
  // Quantizes into q's streams; returns the factor from the sampled groups to all.
  double FillStreams(float step, bool use_delta, uint32_t sample_every, QuantizedSection* q,
                     const QuantizedSection* near = nullptr) const;
  template <bool kNeedRec, typename Visit>
  void Quantize(float step, bool use_delta, uint32_t sample_every, Visit&& visit, const Codebook* cb = nullptr,
                LloydStats* stats = nullptr) const;
  // The codebook Encode and the estimates use at (step, use_delta): empty
  // unless layout().lloyd; learned on one token group in `sample_every`.
  Codebook Learn(float step, bool use_delta, uint32_t sample_every) const;
  // A codebook in the form rows are quantized with: its levels
  // (Codebook::AllLevels), and each channel's choice thresholds (the
  // codebook's levels with its rate term, LloydThresholds) per stream kind,
  // [kind][side][k][channel] (LloydRowInput::thr, stride C).
  struct LloydTables {
    std::vector<float> levels;
    std::vector<float> thr;
    bool plain = false;  // offsets and rate term all 0: rows are rounded (QuantizeRow), thr is empty
    void Build(const Codebook& cb, uint32_t channels, uint32_t head_dim, uint32_t stream_kinds);
  };
  // Quantizes one row with the codebook's levels and rate term; level
  // receives each value's reconstruction level in steps.
  void QuantizeRowLloyd(const Codebook& cb, const LloydTables& t, const float* row, const float* pred,
                        const float* st, const float* inv, bool is_delta, int32_t* q, float* rec, float* level,
                        LloydStats* stats) const;

  SectionLayout layout_;
  std::span<const float> rows_;  // quantized rows [tokens][channels]: the caller's, or y_
  std::vector<float> y_;         // rotated rows (with rotation)
  std::vector<float> exact_;    // original rows of the exact tail
  std::vector<uint8_t> sigma_code_;
  std::vector<int32_t> mean_code_;
  std::vector<float> sigma_, mean_;  // dequantized: what the decoder will use
  double signal_power_ = 0;
  double mean_sigma_sq_ = 0;
  size_t side_info_bytes_ = 0;  // flags, step, scale and mean codes
};

// The 256 channel scales σ̂ a scale code names (FORMAT.md "Section payload").
const std::array<float, 256>& SigmaTable();

struct SectionSink;

// A section payload's header (FORMAT.md "Section payload"): flags, step, grid
// point, channel statistics. Parsed and validated by the CPU decoder and the
// CUDA decoder's plan alike.
struct SectionHeader {
  uint8_t flags = 0;       // bit 0 deltas, bits 1-2 profile statistics / tables, bit 3 codebook
  float step = 0;
  int grid = -1;           // profile grid point, or -1
  size_t stats_begin = 0;  // offset of the channel scale codes (when present)
};
// Reads and validates a section's codebook (FORMAT.md "Reconstruction
// codebook"), which follows the header when flag bit 3 is set.
Status ReadCodebook(ByteReader& r, uint32_t channels, bool use_delta, Codebook* cb);
// The SectionFeature bits (section_format.h) a section with this header asks
// of a schedule that decodes it into `sink`.
uint32_t SectionFeatures(const SectionLayout& layout, const SectionHeader& header, const SectionSink& sink);
// Reads the header from r; sigma and mean receive the C dequantized channel
// scales and means. Leaves r at the codebook (flag bit 3), else at the first symbol stream.
Status ParseSectionHeader(const SectionLayout& layout, ByteReader& r, SectionHeader* header, float* sigma,
                          float* mean);

// A cachegen frame's params (FORMAT.md "Frame parameters") as the layout of
// its sections (section index 0; profile resolved when referenced) and the key
// RoPE settings (kind kNone when the frame has none).
struct CacheGenFrameParams {
  SectionLayout layout;
  RopeConfig rope;
};
Result<CacheGenFrameParams> ReadCacheGenFrameParams(std::span<const uint8_t> params, const KVShape& shape,
                                                    uint32_t token_start, uint32_t context_tokens,
                                                    const ProfileSet* profiles);

class RopeTable;

// Where decoded rows go: section (layer, kv) of a view, any dtype/strides.
struct SectionSink {
  KVView view;
  uint32_t layer = 0;
  KV kv = KV::kKey;
  const RopeTable* rope = nullptr;  // keys: RoPE redone on each row before it is stored
  // Writes the head_dim values of (token, head), converted to the view's dtype.
  void Store(uint32_t token, uint32_t head, const float* values) const;
};

// Decodes a payload written by SectionAnalysis::Encode straight into the
// sink (one pass: rANS, dequantize, closed-loop deltas, dtype conversion).
// On error the sink's section may be partly written.
Status DecodeCacheGenSection(const SectionLayout& layout, std::span<const uint8_t> payload, const SectionSink& sink);
// The same into rows [tokens][channels] of f32.
Status DecodeCacheGenSection(const SectionLayout& layout, std::span<const uint8_t> payload, std::span<float> out,
                             const RopeTable* rope = nullptr);

// The section decoders' per-thread scratch: at least n elements of v, kept
// between calls (grown, never shrunk), returned as a pointer.
template <typename T>
T* GrowScratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace cachegen
