// The `cachegen` codec: per-section coding (section_coder.h) plus rate
// control across the chunk and quality levels that share one analysis.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <cstdio>
#include <optional>

#include "cachegen/profile.h"
#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rope.h"
#include "codec/cachegen/section_coder.h"
#include "codec/cachegen/section_format.h"
#include "codec/codec.h"
#include "common/bytes.h"
#include "common/parallel.h"

namespace cachegen {
namespace {

// Params version 1: the fixed 14 bytes. Version 2 adds optional blocks named
// by flag bits (RoPE); an encoder writes version 1 whenever no such block is
// used, so such frames stay readable by version-1 decoders.
// Default prediction group, measured at 2 bits/value on synthetic KV
// (8x8x128, 512 tokens): G = 1, 2, 4, 8, 16, 32 gave K SNR 10.4, 11.3, 11.1,
// 10.4, 9.8, 10.6 dB. The per-section delta/no-delta choice keeps it safe on
// data without token correlation. To be re-measured on real models.
constexpr uint32_t kDefaultGroupTokens = kCacheGenDefaultGroupTokens;
// How keys are coded, for messages: "RoPE normal (dims 64, theta 10000,
// scale 1)", "no RoPE", with "+ rotation" when rotated.
std::string KeyCodingName(bool rotate, const RopeConfig& rope) {
  std::string s = "no RoPE";
  if (rope.kind != RopeConfig::Kind::kNone) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "RoPE %s (dims %u, theta %g, scale %g)",
                  rope.kind == RopeConfig::Kind::kNeox ? "neox" : "normal", rope.dims, rope.freq_base, rope.freq_scale);
    s = buf;
  }
  return rotate ? s + " + rotation" : s;
}

// A section whose data lies further than this from the profile's statistics
// (octaves, SectionLayout::profile_misfit_octaves) is coded with its own.
// Measured (largest over every section and chunk): stories260K with its
// profile 0.18 on its own kind of text, 0.35 on markdown, 0.79 on random
// characters; the random-weight test model with a profile from 128 tokens
// 0.91. Its profile on synthetic KV of its shape: 1.66 and 2.83 in two of
// four sections (V SNR -0.1 dB with the profile's statistics, docs/results/eval.md).
constexpr float kProfileMisfitOctaves = 1.5f;
// Each quality level below the first targets this fraction of the previous
// level's bits (bits mode), 6 dB less (SNR mode) or twice the error (max-error mode).
constexpr double kLevelBitsRatio = 0.75;
constexpr double kLevelSnrStepDb = 6.0;
// Frame bytes outside sections, for rate targets: fixed header plus one
// section-table entry per section (docs/FORMAT.md, "Frames and containers").
constexpr double kFrameFixedBytes = 64;
constexpr double kFrameBytesPerSection = 24;
// Rate control stops when the sampled estimate is within this fraction of
// its target, and when the full data's exact size is within this one.
constexpr double kSampledTolerance = 0.002;
constexpr double kFullTolerance = 0.003;
// Full-data corrections that move every section: with fewer than
// kMinSectionsToCorrectSome sections, up to kFullCorrections toward
// kFullTolerance, and more (up to kMaxFullCorrections) while beyond
// kFullLimit (near a profile grid boundary the size can jump by several
// percent); with more sections, up to kMaxFullCorrections while beyond
// kWholeCorrectionAbove, then up to kPartialCorrections that move one
// section in kCorrectedShare toward kFullTolerance (CorrectSome; in a chunk
// of few sections the moved ones' steps would move far).
constexpr int kFullCorrections = 2, kMaxFullCorrections = 4, kPartialCorrections = 3;
constexpr double kWholeCorrectionAbove = 0.02, kFullLimit = 0.008;
constexpr uint32_t kCorrectedShare = 4, kMinSectionsToCorrectSome = 8;
// The slope (bits/value per doubling of the step) the first full-data
// correction takes is the sampled search's, within these.
constexpr double kFullSlopeMin = -1.2, kFullSlopeMax = -0.6;

struct Params {
  bool rotate = false;
  uint32_t group_tokens = kDefaultGroupTokens;
  uint32_t recent_tokens = 0;
  float recent_step_scale = 1;
  RopeConfig rope;  // kind kNone: no RoPE block; values as stored (f32)
  std::shared_ptr<const Profile> profile;  // referenced by id
};

std::vector<uint8_t> WriteParams(const Params& p) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  const bool rope = p.rope.kind != RopeConfig::Kind::kNone;
  const bool v2 = rope || p.profile;
  w.U8(v2 ? kParamsVersion2 : kParamsVersion1);
  w.U8((p.rotate ? kParamsRotate : 0) | (rope ? kParamsRope : 0) | (p.profile ? kParamsProfile : 0));
  w.U32(p.group_tokens);
  w.U32(p.recent_tokens);
  w.F32(p.recent_step_scale);
  if (rope) {
    w.U8(static_cast<uint8_t>(p.rope.kind));
    w.U32(p.rope.dims);
    w.F32(static_cast<float>(p.rope.freq_base));
    w.F32(static_cast<float>(p.rope.freq_scale));
  }
  if (p.profile) w.U64(p.profile->id());
  return out;
}

Result<Params> ReadParams(std::span<const uint8_t> bytes, const KVShape& shape, const ProfileSet* profiles) {
  const uint32_t head_dim = shape.head_dim;
  ByteReader r(bytes);
  Params p;
  // The version first: a later version may have other fields (Unsupported), version 0 never existed.
  const uint8_t version = r.U8();
  if (!r.ok() || version == 0) return Status::Corrupt("cachegen params: missing or zero version");
  if (version > kParamsVersion2)
    return Status::Unsupported("cachegen params version " + std::to_string(version) +
                               " is newer than the supported version 2");
  const uint8_t flags = r.U8();
  p.group_tokens = r.U32();
  p.recent_tokens = r.U32();
  p.recent_step_scale = r.F32();
  if (!r.ok()) return Status::Corrupt("cachegen params: wrong length");
  const uint8_t known = version == kParamsVersion1 ? kParamsRotate : (kParamsRotate | kParamsRope | kParamsProfile);
  if (flags & ~known) return Status::Corrupt("cachegen params: unknown flags");
  p.rotate = flags & kParamsRotate;
  if (flags & kParamsRope) {
    const uint8_t kind = r.U8();
    p.rope.dims = r.U32();
    p.rope.freq_base = r.F32();
    p.rope.freq_scale = r.F32();
    if (!r.ok()) return Status::Corrupt("cachegen params: wrong length");
    if (kind != 1 && kind != 2) return Status::Corrupt("cachegen params: unknown RoPE kind " + std::to_string(kind));
    p.rope.kind = static_cast<RopeConfig::Kind>(kind);
    if (!ValidateRope(p.rope, head_dim).ok()) return Status::Corrupt("cachegen params: invalid RoPE block");
  }
  if (flags & kParamsProfile) {
    const uint64_t id = r.U64();
    if (!r.ok()) return Status::Corrupt("cachegen params: wrong length");
    p.profile = profiles ? profiles->Find(id) : nullptr;
    if (!p.profile) {
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(id));
      return Status::NotFound(std::string("frame needs model profile ") + hex +
                              ", which was not given to the decoder (give its .cgprof, e.g. --profile P.cgprof)");
    }
    if (p.profile->layers() != shape.layers || p.profile->kv_heads() != shape.kv_heads ||
        p.profile->head_dim() != head_dim)
      return Status::Corrupt("cachegen params: the referenced profile's shape differs from the frame's");
    // Rows are either Hadamard-rotated or in the profile's transform basis, never both (the encoder refuses it).
    for (uint32_t s = 0; p.rotate && s < 2 * shape.layers; ++s)
      if (p.profile->data().HasTransform(s))
        return Status::Corrupt("cachegen params: rotation with a profile that has head transforms");
  }
  if (r.remaining() != 0) return Status::Corrupt("cachegen params: wrong length");
  if (p.rotate && !IsPowerOfTwo(head_dim)) return Status::Corrupt("cachegen params: rotation needs power-of-two head_dim");
  if (p.group_tokens == 0) return Status::Corrupt("cachegen params: group size 0");
  if (!(p.recent_step_scale >= 0 && p.recent_step_scale <= 1))
    return Status::Corrupt("cachegen params: recent step scale out of [0, 1]");
  return p;
}

// First chunk-relative token of the context's most recent `recent` tokens.
uint32_t RecentBegin(uint32_t token_start, uint32_t tokens, uint32_t context_tokens, uint32_t recent) {
  if (recent == 0) return tokens;
  const int64_t begin = int64_t{context_tokens} - recent - token_start;
  return static_cast<uint32_t>(std::clamp<int64_t>(begin, 0, tokens));
}

SectionLayout MakeLayout(const KVShape& s, const Params& p, uint32_t token_start, uint32_t context_tokens) {
  SectionLayout l;
  l.tokens = s.tokens;
  l.kv_heads = s.kv_heads;
  l.head_dim = s.head_dim;
  l.group_tokens = p.group_tokens;
  l.rotate = p.rotate;
  l.recent_begin = RecentBegin(token_start, s.tokens, context_tokens, p.recent_tokens);
  l.recent_step_scale = p.recent_step_scale;
  l.profile = p.profile ? &p.profile->data() : nullptr;
  return l;
}

uint32_t SectionIndex(uint32_t layer, KV kv) { return layer * 2 + (kv == KV::kValue ? 1 : 0); }

// Layer-wise allocation by rule from the layer count: the step multiplier
// grows geometrically from 2^(-slope/2) at layer 0 to 2^(slope/2) at the last.
float LayerFactor(uint32_t layer, uint32_t layers, double slope) {
  if (layers <= 1 || slope == 0) return 1.0f;
  return static_cast<float>(std::exp2(slope * (double(layer) / (layers - 1) - 0.5)));
}

class CacheGenCodec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kCacheGen; }
  std::string_view name() const override { return "cachegen"; }

  Result<std::vector<EncodedLevel>> Encode(const ChunkF32& chunk, const CodecConfig& cfg) const override {
    const KVShape& s = chunk.shape;
    Params p;
    // A max-error target is a bound per original value: rotation would spread
    // each coefficient's error over the head, so it is off in that mode.
    p.rotate = cfg.rotate && IsPowerOfTwo(s.head_dim) && cfg.max_rel_error <= 0;
    p.group_tokens = cfg.group_tokens ? cfg.group_tokens : kDefaultGroupTokens;
    p.recent_tokens = cfg.recent_tokens;
    p.recent_step_scale = static_cast<float>(std::clamp(cfg.recent_step_scale, 0.0, 1.0));
    if (cfg.rope.kind != RopeConfig::Kind::kNone) {
      p.rope = cfg.rope;
      if (p.rope.dims == 0) p.rope.dims = s.head_dim;
      // What the decoder will read back.
      p.rope.freq_base = static_cast<float>(p.rope.freq_base);
      p.rope.freq_scale = static_cast<float>(p.rope.freq_scale);
      CG_RETURN_IF_ERROR(ValidateRope(p.rope, s.head_dim));
    }
    if (cfg.profile) {
      const internal::ProfileData& d = cfg.profile->data();
      if (d.layers != s.layers || d.kv_heads != s.kv_heads || d.head_dim != s.head_dim)
        return Status::InvalidArgument("profile shape differs from the KV shape");
      if (d.rotate != p.rotate || d.rope.kind != p.rope.kind ||
          (p.rope.kind != RopeConfig::Kind::kNone &&
           (d.rope.dims != p.rope.dims || d.rope.freq_base != p.rope.freq_base ||
            d.rope.freq_scale != p.rope.freq_scale)))
        return Status::InvalidArgument("profile was trained with " + KeyCodingName(d.rotate, d.rope) +
                                       ", this encoder has " + KeyCodingName(p.rotate, p.rope) +
                                       " (give the profile's: --rope/--rope-*, --rotate)");
      // Tables learned for the other quantizer would fit its symbols poorly.
      using TablesFor = internal::ProfileData::TablesFor;
      const bool lloyd = cfg.quantizer == CodecConfig::Quantizer::kLloyd;
      if (d.tables_for != TablesFor::kUnknown && lloyd != (d.tables_for == TablesFor::kLloyd))
        return Status::InvalidArgument(std::string("profile was trained for the ") + (lloyd ? "uniform" : "lloyd") +
                                       " quantizer; encode with that quantizer (--quantizer " +
                                       (lloyd ? "uniform" : "lloyd") + ")");
      // A max-error target bounds each original value, and a transform
      // spreads a coded channel's error over its head (as rotation does).
      if (cfg.max_rel_error > 0 && !d.transform.empty())
        return Status::InvalidArgument("a max-error target cannot use a profile with key transforms");
      p.profile = cfg.profile;
    }
    SectionLayout layout = MakeLayout(s, p, chunk.token_start, chunk.context_tokens);
    // The learned quantizer is used on K sections only: on V sections of
    // stories260K it lowered MSE at equal bits but raised KL (docs/results/eval.md).
    // Its rate term may pick a level other than the nearest, so a max-error
    // bound keeps the uniform quantizer.
    layout.lloyd = cfg.quantizer == CodecConfig::Quantizer::kLloyd && cfg.max_rel_error <= 0;

    const uint32_t n_sections = s.layers * 2;
    // With RoPE, keys are coded un-rotated: per-layer copies turned back.
    std::vector<std::vector<float>> unroped(p.rope.kind != RopeConfig::Kind::kNone ? s.layers : 0);
    std::optional<RopeTable> rope_table;
    if (!unroped.empty()) rope_table.emplace(p.rope, chunk.token_start, s.tokens);
    std::vector<std::optional<SectionAnalysis>> analyses(n_sections);
    CG_RETURN_IF_ERROR(ParallelFor(n_sections, cfg.threads, [&](uint64_t i) {
      std::span<const float> rows = chunk.Section(uint32_t(i / 2), i % 2 ? KV::kValue : KV::kKey);
      if (i % 2 == 0 && rope_table) {
        std::vector<float>& k = unroped[i / 2];
        k.assign(rows.begin(), rows.end());
        for (uint32_t t = 0; t < s.tokens; ++t)
          for (uint32_t h = 0; h < s.kv_heads; ++h)
            rope_table->Apply(t, &k[(size_t{t} * s.kv_heads + h) * s.head_dim], /*inverse=*/true);
        rows = k;
      }
      SectionLayout sl = layout;
      sl.section = uint32_t(i);
      sl.SetProfileTransform();
      sl.lloyd = layout.lloyd && i % 2 == 0;
      sl.profile_misfit_octaves = kProfileMisfitOctaves;
      analyses[i].emplace(sl, rows);
      return Status::Ok();
    }));

    const uint32_t levels = cfg.level_bits.empty() ? std::clamp(cfg.levels, 1u, 8u)
                                                   : static_cast<uint32_t>(cfg.level_bits.size());
    std::vector<EncodedLevel> out(levels);
    // Each level's sections are quantized once on the full data (rate control
    // keeps that quantization and it is what gets coded). The symbol buffers
    // are kept in the chunk's scratch for the encoder's next chunk.
    Scratch local;
    Scratch* scratch = &local;
    if (chunk.scratch) {
      if (!dynamic_cast<Scratch*>(chunk.scratch->get())) *chunk.scratch = std::make_unique<Scratch>();
      scratch = static_cast<Scratch*>(chunk.scratch->get());
    }
    std::vector<QuantizedSection>& q = scratch->q;
    std::vector<QuantizedSection>& spare = scratch->spare;
    q.resize(n_sections);
    spare.resize(n_sections);
    RateMemo memo;
    for (uint32_t lv = 0; lv < levels; ++lv) {
      CG_RETURN_IF_ERROR(ChooseSteps(analyses, s, cfg, lv, &memo, &q, &spare));
      out[lv].params = WriteParams(p);
      if (p.profile) out[lv].predicted_kl = PredictedKl(p.profile->data(), q);
      out[lv].sections.resize(n_sections);
      CG_RETURN_IF_ERROR(ParallelFor(n_sections, cfg.threads, [&](uint64_t i) {
        EncodedSection& es = out[lv].sections[i];
        analyses[i]->Encode(q[i], &es.bytes, &es.side_bytes);
        es.unlike_profile = p.profile && !analyses[i]->layout().profile;
        return Status::Ok();
      }));
    }
    return out;
  }

  Status DecodeSection(const SectionContext& ctx, std::span<const uint8_t> payload,
                       std::span<float> out) const override {
    CG_ASSIGN_OR_RETURN(const Params p, ReadParams(ctx.params, ctx.shape, ctx.profiles));
    return DecodeCacheGenSection(Layout(ctx, p), payload, out, KeyRope(ctx, p));
  }

  Status DecodeSectionToView(const SectionContext& ctx, std::span<const uint8_t> payload, const KVView& out,
                             std::vector<float>&) const override {
    CG_ASSIGN_OR_RETURN(const Params p, ReadParams(ctx.params, ctx.shape, ctx.profiles));
    return DecodeCacheGenSection(Layout(ctx, p), payload, SectionSink{out, ctx.layer, ctx.kv, KeyRope(ctx, p)});
  }

 private:
  static SectionLayout Layout(const SectionContext& ctx, const Params& p) {
    SectionLayout l = MakeLayout(ctx.shape, p, ctx.token_start, ctx.context_tokens);
    l.section = SectionIndex(ctx.layer, ctx.kv);
    l.SetProfileTransform();
    return l;
  }
  // The RoPE table a K section's decoded rows go through (none for V).
  static const RopeTable* KeyRope(const SectionContext& ctx, const Params& p) {
    if (ctx.kv != KV::kKey || p.rope.kind == RopeConfig::Kind::kNone) return nullptr;
    return &CachedRopeTable(p.rope, ctx.token_start, ctx.shape.tokens);
  }

  using Analyses = std::vector<std::optional<SectionAnalysis>>;
  struct Scratch final : EncodeScratch {
    std::vector<QuantizedSection> q, spare;
  };

  // What the bits-mode rate control of one chunk carries from level to level:
  // the delta choices (made at the unit step, so the same for every level),
  // the sampled size estimates it evaluated (log2 step, bits per value) and
  // the ratio of the sampled estimate to the full-data size last seen.
  struct RateMemo {
    std::vector<uint8_t> deltas;
    std::vector<std::pair<double, double>> sampled;
    double bias = 1;
  };

  // Fills q with the level's full-data quantization of every section; spare
  // is scratch of the same size.
  static Status ChooseSteps(const Analyses& a, const KVShape& s, const CodecConfig& cfg, uint32_t level,
                            RateMemo* memo, std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare) {
    const uint32_t n = static_cast<uint32_t>(a.size());
    std::vector<float> steps(n);
    std::vector<uint8_t> deltas(n);
    if (cfg.max_rel_error > 0) {
      // Uniform quantization error is at most half a step.
      const float step = static_cast<float>(2 * cfg.max_rel_error * std::exp2(double(level)));
      for (uint32_t i = 0; i < n; ++i) steps[i] = step;
      CG_RETURN_IF_ERROR(ParallelFor(n, cfg.threads, [&](uint64_t i) {
        deltas[i] = a[i]->PreferDelta(steps[i]);
        return Status::Ok();
      }));
    } else if (cfg.max_kl > 0) {
      const double target = cfg.max_kl * std::pow(kLevelKlRatio, level);
      CG_ASSIGN_OR_RETURN(const std::vector<float> factors, KlStepFactors(cfg, n));
      const double m = MultiplierForKl(cfg.profile->data(), factors, target);
      for (uint32_t i = 0; i < n; ++i) steps[i] = static_cast<float>(std::clamp(m * factors[i], 1e-6, 1e6));
      CG_RETURN_IF_ERROR(MemoDeltas(a, factors, 1, cfg.threads, memo));
      deltas = memo->deltas;
    } else if (cfg.snr_db > 0) {
      const double snr = cfg.snr_db - kLevelSnrStepDb * level;
      CG_RETURN_IF_ERROR(ParallelFor(n, cfg.threads, [&](uint64_t i) {
        steps[i] = StepForSnr(*a[i], snr, &deltas[i]);
        return Status::Ok();
      }));
    } else {
      const double target = cfg.level_bits.empty()
                                ? (cfg.bits_per_value > 0 ? cfg.bits_per_value : kDefaultBitsPerValue) *
                                      std::pow(kLevelBitsRatio, level)
                                : cfg.level_bits[level];
      return StepsForBits(a, s, cfg, target, memo, q, spare);
    }
    return ParallelFor(n, cfg.threads, [&](uint64_t i) {
      a[i]->QuantizeStreams(steps[i], deltas[i], 1, &(*q)[i]);
      return Status::Ok();
    });
  }

  // The delta choices of every level (made once per chunk at the sections'
  // unit steps, on one token group in `sample_every`), kept in the memo.
  static Status MemoDeltas(const Analyses& a, const std::vector<float>& factors, uint32_t sample_every,
                           uint32_t threads, RateMemo* memo) {
    if (!memo->deltas.empty()) return Status::Ok();
    memo->deltas.resize(a.size());
    return ParallelFor(a.size(), threads, [&](uint64_t i) {
      memo->deltas[i] = a[i]->PreferDelta(factors[i], sample_every);
      return Status::Ok();
    });
  }

  // Section step multipliers of a KL target: the profile's sensitivity
  // factors (equal predicted KL in every section: the least bits for a KL
  // sum at high rate).
  static Result<std::vector<float>> KlStepFactors(const CodecConfig& cfg, uint32_t sections) {
    std::vector<float> f = cfg.profile ? cfg.profile->data().SensitivityStepFactors() : std::vector<float>{};
    if (f.size() != sections)
      return Status::InvalidArgument("a KL target needs a model profile with measured sensitivities");
    return f;
  }

  // Sum over sections of each one's predicted KL at its step (the sections'
  // effects add up at small errors), scaled by the profile's joint
  // calibration; -1 without sensitivities.
  static double PredictedKl(const internal::ProfileData& d, const std::vector<QuantizedSection>& q) {
    if (d.sensitivity.size() != q.size()) return -1;
    double kl = 0;
    for (size_t i = 0; i < q.size(); ++i) kl += d.SectionKl(uint32_t(i), q[i].step);
    return d.CalibratedKl(kl);
  }

  // The multiplier m of the section step factors at which the predicted KL
  // sum reaches `target_kl` (bisection in log2 m: the prediction is
  // non-decreasing in every step); the largest searched when even that
  // predicts less.
  static double MultiplierForKl(const internal::ProfileData& d, const std::vector<float>& factors, double target_kl) {
    auto kl_at = [&](double log_m) {
      double kl = 0;
      for (size_t i = 0; i < factors.size(); ++i) kl += d.SectionKl(uint32_t(i), std::exp2(log_m) * factors[i]);
      return d.CalibratedKl(kl);
    };
    double lo = -20, hi = 20;
    if (kl_at(hi) <= target_kl) return std::exp2(hi);
    for (int iter = 0; iter < 60; ++iter) {
      const double mid = (lo + hi) / 2;
      (kl_at(mid) < target_kl ? lo : hi) = mid;
    }
    return std::exp2(lo);
  }

  // Per-section step whose measured reconstruction SNR is close to `snr_db`
  // (a few corrections of the high-rate estimate step^2/12).
  static float StepForSnr(const SectionAnalysis& a, double snr_db, uint8_t* delta) {
    const double target_mse = a.signal_power() * std::pow(10.0, -snr_db / 10);
    double step = std::sqrt(12 * target_mse / std::max(1e-30, a.mean_sigma_sq()));
    step = std::clamp(step, 1e-6, 1e6);
    *delta = a.PreferDelta(static_cast<float>(step));
    for (int iter = 0; iter < 3; ++iter) {
      const double mse = a.MeasureMse(static_cast<float>(step), *delta);
      if (!(mse > 0) || std::abs(mse / target_mse - 1) < 0.05) break;
      step = std::clamp(step * std::sqrt(target_mse / mse), 1e-6, 1e6);
    }
    return static_cast<float>(step);
  }

  // One global step multiplier (times the layer factor): a secant search on
  // log2(step) against sampled size estimates of all sections, then the
  // full data quantized at the point found; when its exact size misses the
  // target, at most two corrections on the full data (the best point is kept).
  static Status StepsForBits(const Analyses& a, const KVShape& s, const CodecConfig& cfg, double target_bits,
                             RateMemo* memo, std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare) {
    const uint32_t n = static_cast<uint32_t>(a.size());
    const double values = double(s.values());
    const double frame_bytes = kFrameFixedBytes + kFrameBytesPerSection * n;
    // Sample about 8 token groups per section during the search: with
    // thousands of channels per section that is tens of thousands of symbols,
    // plenty for the histograms, and it keeps the search cheap.
    constexpr uint32_t kSampledGroups = 8;
    const uint32_t groups = std::max(1u, s.tokens / std::max(1u, a[0]->layout().group_tokens));
    const uint32_t sample_every = std::max(1u, groups / kSampledGroups);
    // Section i is layer i / 2, K when i is even. A profile with measured
    // sensitivities w_i replaces the rule (layer slope, key scale) by
    // step_i ∝ 1/sqrt(w_i): equal weighted distortion w_i step_i^2 in every
    // section, which minimises their sum at a bit budget at high rate.
    const float key_scale = static_cast<float>(cfg.key_step_scale);
    const std::vector<float> measured =
        cfg.profile ? cfg.profile->data().SensitivityStepFactors() : std::vector<float>{};
    auto factor = [&](uint32_t i) {
      if (!measured.empty()) return measured[i];
      return LayerFactor(i / 2, s.layers, cfg.layer_slope) * (i % 2 == 0 ? key_scale : 1.0f);
    };
    auto step_at = [&](double log_step, uint32_t i) { return static_cast<float>(std::exp2(log_step)) * factor(i); };
    std::vector<float> factors(n);
    for (uint32_t i = 0; i < n; ++i) factors[i] = factor(i);
    CG_RETURN_IF_ERROR(MemoDeltas(a, factors, sample_every, cfg.threads, memo));
    const std::vector<uint8_t>& deltas = memo->deltas;
    // Bits per value of the sections quantized into qs at log_step (with
    // the codebooks of `near`'s quantizations where they are near enough,
    // SectionAnalysis::QuantizeStreams).
    auto bits_at = [&](double log_step, uint32_t every, std::vector<QuantizedSection>* qs,
                       const std::vector<QuantizedSection>* near = nullptr) -> Result<double> {
      CG_RETURN_IF_ERROR(ParallelFor(n, cfg.threads, [&](uint64_t i) {
        a[i]->QuantizeStreams(step_at(log_step, uint32_t(i)), deltas[i], every, &(*qs)[i], near ? &(*near)[i] : nullptr);
        return Status::Ok();
      }));
      double total = frame_bytes;
      for (const QuantizedSection& x : *qs) total += x.bytes;
      return total * 8 / values;
    };

    // Sampled search, aimed at the target times the sampled estimate's bias
    // seen so far; it starts from the two nearest points evaluated for an
    // earlier level, else from the unit step and a slope of -1.
    const double sampled_target = target_bits * memo->bias;
    auto sampled_at = [&](double x) -> Result<double> {
      CG_ASSIGN_OR_RETURN(const double b, bits_at(x, sample_every, spare, spare));
      memo->sampled.emplace_back(x, b);
      return b - sampled_target;
    };
    double x0 = 0, x1 = 0, f0 = 0;
    if (memo->sampled.size() >= 2) {
      std::vector<std::pair<double, double>> near = memo->sampled;
      std::sort(near.begin(), near.end(), [&](const auto& l, const auto& r) {
        return std::abs(l.second - sampled_target) < std::abs(r.second - sampled_target);
      });
      x0 = near[1].first;
      f0 = near[1].second - sampled_target;
      x1 = near[0].first;
      if (std::abs(near[0].second - near[1].second) > 1e-9 && x0 != x1) {
        const double slope = (near[0].second - near[1].second) / (x1 - x0);
        if (slope < -0.05) x1 -= (near[0].second - sampled_target) / slope;
      }
    } else {
      CG_ASSIGN_OR_RETURN(f0, sampled_at(x0));
      x1 = x0 + f0;  // bits fall by about one per doubling of the step
    }
    x1 = std::clamp(x1, -20.0, 20.0);
    double slope = -1;  // d bits / d log2 step, last secant
    for (int iter = 0; iter < 10; ++iter) {
      CG_ASSIGN_OR_RETURN(const double f1, sampled_at(x1));
      double next = x1 + f1;  // fallback slope -1
      if (std::abs(f1 - f0) > 1e-9 && x1 != x0) {
        const double sl = (f1 - f0) / (x1 - x0);
        if (sl < -0.05) {
          slope = sl;
          next = x1 - f1 / sl;
        }
      }
      x0 = x1;
      f0 = f1;
      if (std::abs(f0) <= kSampledTolerance * target_bits) break;
      x1 = std::clamp(std::clamp(next, x0 - 4, x0 + 4), -20.0, 20.0);
    }
    const double sampled_bits = f0 + sampled_target;

    // The full data at x0, then corrections along the sampled slope and by
    // secant, which reuse the codebooks learned at x0; q keeps the best point.
    // The last sampled secant may span a tiny step (the search ends close to
    // its target) and be far off the full data's slope; the full data's
    // slopes measured on docs6L and the Llama-3.2-1B shape lie in -0.6 ... -1.2
    // bits per doubling at 0.8-2 bits/value.
    slope = std::clamp(slope, kFullSlopeMin, kFullSlopeMax);
    CG_ASSIGN_OR_RETURN(const double full0, bits_at(x0, 1, q));
    memo->bias = sampled_bits / full0;
    double xq = x0, xa = x0, fa = full0 - target_bits, best = fa;
    auto off = [&](double f, double limit) { return std::abs(f) > limit * target_bits; };
    // Every section moves while the size is far off (or until it is within
    // tolerance, when there are too few sections to move some of them only).
    const double whole_above = n >= kMinSectionsToCorrectSome ? kWholeCorrectionAbove : kFullTolerance;
    for (int iter = 0; iter < kMaxFullCorrections && off(best, kFullTolerance) &&
                       off(best, iter < kFullCorrections ? whole_above : std::max(whole_above, kFullLimit));
         ++iter) {
      const double xb = std::clamp(xa - fa / slope, std::max(-20.0, xa - 4), std::min(20.0, xa + 4));
      CG_ASSIGN_OR_RETURN(double fb, bits_at(xb, 1, spare, q));
      fb -= target_bits;
      if (std::abs(fb) < std::abs(best)) {
        best = fb;
        xq = xb;
        q->swap(*spare);
      }
      if (std::abs(fb - fa) > 1e-9 && (fb - fa) / (xb - xa) < -0.05) slope = (fb - fa) / (xb - xa);
      xa = xb, fa = fb;
    }
    return CorrectSome(a, cfg, step_at, target_bits, xq, best, slope, frame_bytes * 8 / values, values, q, spare);
  }

  // The last corrections of bits-mode rate control move the steps of the
  // quarter of the sections with the most bytes only (a quarter of the work
  // of moving every section): from the step multiplier xq at which q was
  // quantized, missing the target by `best` bits/value, the sections of S
  // take xq + y (secant on y, starting from the whole data's slope scaled to
  // S's share). For a miss of 2 % their steps move by about 10 %; the
  // distortion at equal bits is about 0.2 % above moving every section's.
  template <typename StepAt>
  static Status CorrectSome(const Analyses& a, const CodecConfig& cfg, const StepAt& step_at, double target_bits,
                            double xq, double best, double slope, double frame_bits, double values,
                            std::vector<QuantizedSection>* q, std::vector<QuantizedSection>* spare) {
    const uint32_t n = static_cast<uint32_t>(a.size());
    if (n < kMinSectionsToCorrectSome || !(std::abs(best) > kFullTolerance * target_bits)) return Status::Ok();
    std::vector<uint32_t> moved(n);
    std::iota(moved.begin(), moved.end(), 0u);
    const uint32_t k = std::max(1u, n / kCorrectedShare);
    std::partial_sort(moved.begin(), moved.begin() + k, moved.end(),
                      [&](uint32_t l, uint32_t r) { return (*q)[l].bytes > (*q)[r].bytes; });
    moved.resize(k);
    std::vector<bool> is_moved(n, false);
    for (uint32_t i : moved) is_moved[i] = true;
    double ya = 0, fa = best, slope_moved = slope * k / n;
    for (int iter = 0; iter < kPartialCorrections && std::abs(best) > kFullTolerance * target_bits; ++iter) {
      const double yb = std::clamp(ya - fa / slope_moved, ya - 1, ya + 1);
      CG_RETURN_IF_ERROR(ParallelFor(k, cfg.threads, [&](uint64_t j) {
        const uint32_t i = moved[j];
        a[i]->QuantizeStreams(step_at(xq + yb, i), (*q)[i].use_delta, 1, &(*spare)[i], &(*q)[i]);
        return Status::Ok();
      }));
      double bits = frame_bits;
      for (uint32_t i = 0; i < n; ++i) bits += (is_moved[i] ? (*spare)[i] : (*q)[i]).bytes * 8 / values;
      const double fb = bits - target_bits;
      if (std::abs(fb) < std::abs(best)) {
        best = fb;
        for (uint32_t i : moved) std::swap((*q)[i], (*spare)[i]);
      }
      if (std::abs(fb - fa) > 1e-9 && (fb - fa) / (yb - ya) < -0.05 * k / n) slope_moved = (fb - fa) / (yb - ya);
      ya = yb, fa = fb;
    }
    return Status::Ok();
  }
};

}  // namespace

Result<CacheGenFrameParams> ReadCacheGenFrameParams(std::span<const uint8_t> params, const KVShape& shape,
                                                    uint32_t token_start, uint32_t context_tokens,
                                                    const ProfileSet* profiles) {
  CG_ASSIGN_OR_RETURN(const Params p, ReadParams(params, shape, profiles));
  return CacheGenFrameParams{MakeLayout(shape, p, token_start, context_tokens), p.rope};
}

std::unique_ptr<Codec> MakeCacheGenCodec() { return std::make_unique<CacheGenCodec>(); }

}  // namespace cachegen
