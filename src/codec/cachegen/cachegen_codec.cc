// The `cachegen` codec: per-section coding (section_coder.h) with the
// chunk's steps from rate control (rate_control.h), quality levels sharing
// one analysis; its frame parameters.
#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdio>
#include <optional>

#include "cachegen/profile.h"
#include "codec/cachegen/hadamard.h"
#include "codec/cachegen/profile_data.h"
#include "codec/cachegen/rate_control.h"
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
    SectionAnalyses analyses(n_sections);
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

  struct Scratch final : EncodeScratch {
    std::vector<QuantizedSection> q, spare;
  };
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
